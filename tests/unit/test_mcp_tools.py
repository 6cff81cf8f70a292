"""MCP tools (app/chat/mcp_tools.py) against a real MCP server started over stdio
(tests/mcp_test_server.py, the official SDK's MCPServer): listing, calling, a time limit, a
call cancelled by its caller, and no process left once closed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import psutil
import pytest

from minisgl_app.chat.mcp_tools import McpError, McpServer, McpServerSpec, ToolResult

SERVER = str(Path(__file__).parents[1] / "mcp_test_server.py")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spec(pid_file: Path) -> McpServerSpec:
    return McpServerSpec("test-tools", command=sys.executable, args=(SERVER, str(pid_file)))


@pytest.mark.anyio
async def test_tools_listed_called_limited_and_cancelled_then_the_process_is_gone(tmp_path):
    server = McpServer(spec(tmp_path / "pid"))
    await server.start()
    try:
        pid = int((tmp_path / "pid").read_text())
        tools = {t.name: t for t in await server.tools()}
        assert set(tools) == {"add", "slow", "fail", "hang"}
        add = tools["add"].openai_tool()["function"]
        assert add["description"] == "Add two whole numbers."
        assert add["parameters"]["required"] == ["a", "b"]

        assert await server.call("add", {"a": 2, "b": 40}) == ToolResult("42")
        failed = await server.call("fail", {"reason": "no network"})
        assert failed.is_error and "no network" in failed.text
        late = await server.call("slow", {"seconds": 30}, time_limit=0.5)
        assert late == ToolResult("the tool slow took longer than 0.5 s", True)

        stopped = asyncio.create_task(server.call("slow", {"seconds": 30}))
        await asyncio.sleep(0.5)
        stopped.cancel()  # the user's Stop
        with pytest.raises(asyncio.CancelledError):
            await stopped
        assert await server.call("add", {"a": 1, "b": 1}) == ToolResult("2"), "still serving"
    finally:
        await server.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.anyio
async def test_a_server_that_cannot_start_says_so(tmp_path):
    missing = McpServer(McpServerSpec("gone", command=str(tmp_path / "no-such-command")))
    with pytest.raises(McpError, match="'gone' could not start"):
        await missing.start()
    with pytest.raises(McpError, match="give a command or a URL"):
        McpServerSpec("both", command="x", url="http://127.0.0.1:1/mcp")
