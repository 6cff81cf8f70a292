"""An MCP server for the tests (stdio): ``add(a, b)``, ``slow(seconds)``, ``fail(reason)`` and
``hang()`` (waits until cancelled); with an argument,
its process id is written to that file (to check it is gone after the client closes)."""

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
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as file:
            file.write(str(os.getpid()))
    server.run()
