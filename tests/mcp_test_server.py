"""An MCP server for the tests: ``add(a, b)``, ``slow(seconds)``, ``fail(reason)`` and ``hang()``
(waits until cancelled). Over stdio; with ``--http PORT``, over streamable HTTP at
``http://127.0.0.1:PORT/mcp``. With another argument, its process id is written to that file
(to check it is gone after the client closes)."""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Wait for a number of seconds, then say so."""
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} s"


@server.tool()
async def hang() -> str:
    """Wait until cancelled."""
    await asyncio.Event().wait()
    return "never"


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(reason)


if __name__ == "__main__":
    args = sys.argv[1:]
    port = None
    if "--http" in args:
        at = args.index("--http")
        port = int(args[at + 1])
        del args[at : at + 2]
    if args:
        with open(args[0], "w") as file:
            file.write(str(os.getpid()))
    if port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)
