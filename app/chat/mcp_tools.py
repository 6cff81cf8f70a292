"""Tools from MCP servers (Model Context Protocol, through the official ``mcp`` SDK): a server
the user adds is started (a stdio command, with the user's rights) or reached (a streamable-HTTP
URL), its tools listed as OpenAI function tools, and each call run with a time limit.

One :class:`McpServer` keeps its session open in a task of its own: the SDK's transports are
anyio context managers, which must be left by the task that entered them, while calls come from
the replies' tasks. ``close`` ends that task, and with it the server's process (the SDK stops a
stdio server's whole process tree). A call cancelled by its caller (Stop) is cancelled in the
session too; a call past its time limit returns an error result that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CALL_TIME_LIMIT_S = 60.0  # a tool that runs longer is stopped, and the model told so
START_TIME_LIMIT_S = 30.0  # a server that has not answered `initialize` by then is given up


class McpError(Exception):
    """A server that cannot be started or reached, or a tool it does not have: ``str(exc)`` says
    which, naming it."""


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one MCP server: a ``command`` (stdio) or a ``url`` (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # added to the default environment
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise McpError(f"MCP server {self.name!r}: give a command or a URL, not both")


@dataclass(frozen=True)
class ToolInfo:
    """One tool of one server, as the model is shown it."""

    server: str
    name: str
    description: str
    parameters: dict[str, Any]

    def openai_tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters or {"type": "object", "properties": {}},
            },
        }


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back, as the text the model reads next (``is_error``: a failure)."""

    text: str
    is_error: bool = False


class McpServer:
    """One running MCP server and its session (``start`` once, ``close`` at the end)."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.session = None  # mcp.ClientSession, once started
        self._task: asyncio.Task | None = None
        self._closing = asyncio.Event()

    async def start(self) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold_session(ready), name=f"mcp-{self.spec.name}")
        try:
            self.session = await asyncio.wait_for(asyncio.shield(ready), START_TIME_LIMIT_S)
        except Exception as exc:
            await self.close()
            if isinstance(exc, TimeoutError):
                raise McpError(
                    f"MCP server {self.spec.name!r} did not answer within {START_TIME_LIMIT_S:g} s"
                ) from None
            raise McpError(f"MCP server {self.spec.name!r} could not start: {exc}") from None

    async def _hold_session(self, ready: asyncio.Future) -> None:
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 (a start that failed: its caller says why)
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpError(str(exc)))
            if not isinstance(exc, Exception):
                raise

    def _transport(self):
        if self.spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.spec.url)
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        params = StdioServerParameters(
            command=self.spec.command,
            args=list(self.spec.args),
            env={**get_default_environment(), **dict(self.spec.env)},
        )
        return stdio_client(params)

    async def tools(self) -> list[ToolInfo]:
        listed = await self._session().list_tools()
        return [
            ToolInfo(self.spec.name, t.name, t.description or "", dict(t.input_schema or {}))
            for t in listed.tools
        ]

    async def call(
        self, name: str, arguments: dict[str, Any], time_limit: float = CALL_TIME_LIMIT_S
    ) -> ToolResult:
        """Run tool ``name``; its text content joined (a result with none: its structured
        content as JSON). Cancelling the caller cancels the call."""
        try:
            result = await asyncio.wait_for(self._session().call_tool(name, arguments), time_limit)
        except TimeoutError:
            return ToolResult(f"the tool {name} took longer than {time_limit:g} s", True)
        parts = [c.text for c in getattr(result, "content", None) or [] if hasattr(c, "text")]
        structured = getattr(result, "structured_content", None)
        text = "\n".join(parts) if parts else json.dumps(structured, ensure_ascii=False)
        return ToolResult(text, bool(getattr(result, "is_error", False)))

    def _session(self):
        if self.session is None:
            raise McpError(f"MCP server {self.spec.name!r} is not running")
        return self.session

    async def close(self) -> None:
        """End the session and the server's process (stdio)."""
        self._closing.set()
        self.session = None
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)
            self._task = None


__all__ = ["McpError", "McpServer", "McpServerSpec", "ToolInfo", "ToolResult"]
