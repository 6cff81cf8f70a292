"""Tools in a chat's reply: the model calls a tool, the user approves, the tool runs, and the
model goes on with its result; all inside one reply, with no page involved.

- :class:`ToolBox` holds the app's running MCP servers (mcp_tools.McpServer), started when the
  user adds one in the Tools panel (or, for those added before, when the app starts); nothing
  runs before that. A stdio server runs on this machine with the user's rights.
- :class:`ToolLoop` wraps one reply's ``generate``: it offers the chat's tools to the model,
  reads the calls out of the reply (through the source's :class:`ToolWire`: this machine's
  engine takes them in its prompt and writes calls in the reply's text, a remote OpenAI server
  takes ``tools`` and streams ``tool_calls``), waits for the
  user's decision on each (``decide``: allow once, always, deny; a tool the chat always allows
  runs at once), runs it, and asks the model again with the results as ``tool`` messages, up to
  ``MAX_ROUNDS`` rounds. Between the reply's pieces it yields :class:`ToolStep`: the reply's
  calls so far, which ReplyManager (live.py) shows and stores with the reply.

Stop ends the loop at once: a decision being waited for, or a tool running (its call is
cancelled, and the MCP session cancels it in the server). A tool past its time limit gives an
error result that says so, which the model reads like any other.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from minisgl_engine import (
    DEFAULT_TOOL_FORMAT,
    GenerateRequest,
    GrammarSpec,
    PromptProgressMsg,
    ToolCall,
    ToolCallParser,
    UserReply,
    with_tool_prompt,
)

from .mcp_tools import McpError, McpServer, McpServerSpec, ToolInfo, ToolResult
from .remote_wire import until_stopped
from .store import ToolCallRecord, ToolServerRecord

MAX_ROUNDS = 5  # tool rounds in one reply; calls after the last are not run
ALLOW_ONCE, ALLOW_ALWAYS, DENY = "once", "always", "deny"
DECISIONS = (ALLOW_ONCE, ALLOW_ALWAYS, DENY)
DENIED = "The user denied this tool call."
STOPPED = "Stopped before the tool finished."
ROUND_LIMIT = f"Not run: a reply may call tools in at most {MAX_ROUNDS} rounds."
UNKNOWN_TOOL = "Not run: the chat has no tool named {name}."

Generate = Callable[[GenerateRequest, asyncio.Event], AsyncIterator[UserReply | PromptProgressMsg]]


def tool_key(tool: ToolInfo) -> str:
    """How settings and records name a tool: "server/tool"."""
    return f"{tool.server}/{tool.name}"


@dataclass(frozen=True)
class ToolStep:
    """The reply's tool calls so far (each time one is made, decided or answered)."""

    calls: tuple[ToolCallRecord, ...]


class CallReader(Protocol):
    """One round's reply read for calls: ``push`` takes each thing the source yields (its
    UserReply, or a remote's ToolCallsMade) and gives back the reply's text and the calls in it."""

    def push(self, out: Any) -> tuple[str, list[ToolCall]]: ...


class ToolWire(Protocol):
    """How a reply source takes the chat's tools and gives back the model's calls: ``ask`` is the
    round's request (``forced``: it must call one of these), ``reader`` reads its reply."""

    def ask(
        self,
        request: GenerateRequest,
        messages: list[dict],
        tools: list[ToolInfo],
        forced: list[ToolInfo],
    ) -> GenerateRequest: ...

    def reader(self) -> CallReader: ...


class ToolRunner(Protocol):
    """What runs a tool: ToolBox, or a stand-in in the tests."""

    async def call(self, key: str, arguments: dict[str, Any]) -> ToolResult: ...


class ToolBox:
    """The app's MCP servers that run now, by name, and their tools."""

    def __init__(self) -> None:
        self.servers: dict[str, McpServer] = {}
        self.tools: dict[str, list[ToolInfo]] = {}  # server name -> its tools
        self.errors: dict[str, str] = {}  # server name -> why it does not run
        self.starting = asyncio.Lock()  # two tabs opening the panel start a server once

    async def start(self, record: ToolServerRecord) -> list[ToolInfo]:
        """Start (or reach) the server and list its tools; McpError says why it cannot."""
        async with self.starting:
            if record.name in self.servers:
                return self.tools[record.name]
            return await self._start(record)

    async def _start(self, record: ToolServerRecord) -> list[ToolInfo]:
        spec = McpServerSpec(
            record.name, record.command, tuple(record.args), dict(record.env), record.url
        )
        server = McpServer(spec)
        try:
            await server.start()
            tools = await server.tools()
        except McpError as exc:
            self.errors[record.name] = str(exc)
            await server.close()
            raise
        except Exception as exc:  # noqa: BLE001 (a server that answers the listing wrong)
            await server.close()
            self.errors[record.name] = f"MCP server {record.name!r}: {exc}"
            raise McpError(self.errors[record.name]) from None
        self.errors.pop(record.name, None)
        self.servers[record.name], self.tools[record.name] = server, tools
        return tools

    async def stop(self, name: str) -> None:
        """End the server (a stdio one's process with it)."""
        server = self.servers.pop(name, None)
        self.tools.pop(name, None)
        self.errors.pop(name, None)
        if server is not None:
            await server.close()

    async def close(self) -> None:
        for name in list(self.servers):
            await self.stop(name)

    def offered(self, keys: tuple[str, ...]) -> list[ToolInfo]:
        """The tools of ``keys`` ("server/tool") that run now, in that order."""
        running = {tool_key(t): t for tools in self.tools.values() for t in tools}
        return [running[k] for k in keys if k in running]

    async def call(self, key: str, arguments: dict[str, Any]) -> ToolResult:
        server_name, name = key.split("/", 1)
        server = self.servers.get(server_name)
        if server is None:
            return ToolResult(f"the MCP server {server_name!r} is not running", True)
        try:
            return await server.call(name, arguments)
        except McpError as exc:
            return ToolResult(str(exc), True)
        except Exception as exc:  # noqa: BLE001 (a broken session: the model and the user read why)
            return ToolResult(f"the tool {name} failed: {exc}", True)


def tool_request(
    request: GenerateRequest,
    messages: list[dict],
    tools: list[ToolInfo],
    forced: list[ToolInfo],
    tool_format: str | None,
) -> GenerateRequest:
    """``request`` with ``messages`` and ``tools`` offered, as the OpenAI route makes it: a
    template that knows tools lays them out (``tool_format`` set), else the default tool prompt
    does; ``forced``: the reply must call one of these (the engine's tool-call grammar)."""
    openai_tools = [t.openai_tool() for t in tools]
    kwargs = dict(request.chat_template_kwargs or {})
    if tool_format is None:
        messages = with_tool_prompt(messages, openai_tools)
    else:
        kwargs["tools"] = openai_tools
    params = request.params
    if forced:
        spec = {
            "format": tool_format or DEFAULT_TOOL_FORMAT,
            "tools": [
                {"name": t.name, "parameters": t.parameters or {"type": "object"}} for t in forced
            ],
        }
        params = replace(params, grammar=GrammarSpec("tool_call", json.dumps(spec)))
    return replace(request, params=params, messages=messages, chat_template_kwargs=kwargs or None)


@dataclass
class TextCalls:
    """The engine's calls, in its reply's text (``tool_format``'s tags, or the default tool
    prompt's): the parser takes them out of the text as it streams."""

    parser: ToolCallParser

    def push(self, out: UserReply) -> tuple[str, list[ToolCall]]:
        text, calls = self.parser.push(out.incremental_output)
        if out.finished or out.error:
            more, more_calls = self.parser.flush()
            text, calls = text + more, calls + more_calls
        return text, calls


@dataclass(frozen=True)
class EngineTools:
    """This machine's engine (LocalEngine.tool_wire): tools in the prompt, as the OpenAI route
    puts them (``tool_format``: the chat template's convention, None for the default tool
    prompt), a forced call held by the engine's grammar, calls read out of the text."""

    tool_format: str | None = None

    def ask(self, request, messages, tools, forced) -> GenerateRequest:
        return tool_request(request, messages, tools, forced, self.tool_format)

    def reader(self) -> TextCalls:
        return TextCalls(ToolCallParser(self.tool_format or DEFAULT_TOOL_FORMAT))


CALLS = "tool_call_records"  # a stored reply's calls, on its message until it is spelled out


def spelled_out(messages: list[dict]) -> list[dict]:
    """``messages`` as the model reads them: each one that carries its reply's calls (CALLS: one
    message per stored message, so that a chat is fitted to the context by whole turns) as its
    call turns (``call_turns``); the others as they are."""
    out: list[dict] = []
    for m in messages:
        calls = m.get(CALLS)
        out += call_turns(m["content"], list(calls)) if calls else [m]
    return out


def call_turns(content: str, calls: list[ToolCallRecord]) -> list[dict]:
    """A reply's calls as the model reads them back: per call offset, the text before it as an
    assistant turn with its calls, then one ``tool`` turn per call; the text after the last
    call as a last assistant turn."""
    out: list[dict] = []
    start = 0
    for offset in sorted({c.offset for c in calls}):
        group = [c for c in calls if c.offset == offset]
        out.append(
            {
                "role": "assistant",
                "content": content[start:offset],
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                    }
                    for c in group
                ],
            }
        )
        out += [{"role": "tool", "tool_call_id": c.id, "content": _answer(c)} for c in group]
        start = offset
    if content[start:] or not calls:
        out.append({"role": "assistant", "content": content[start:]})
    return out


async def _until_stopped(step, stop: asyncio.Event):
    """``await step`` unless Stop comes first: then ``step`` is cancelled (a tool's call with
    it, in the server too) and the result is None."""
    stopper = asyncio.ensure_future(stop.wait())
    try:
        return await until_stopped(step, stopper)
    finally:
        stopper.cancel()


def _arguments(text: str) -> Any:
    """A call's arguments as templates read them: the JSON object (text that is not JSON as is)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answer(call: ToolCallRecord) -> str:
    if call.state in ("waiting", "running"):
        return STOPPED  # the app stopped before it ended
    return call.result


@dataclass
class ToolLoop:
    """One reply's tool rounds (see the module's docstring). ``tools``: those the chat offers
    that run now; ``forced``: the first round must call one of these (``tool_choice``);
    ``always``: the tools the chat runs without asking; ``wire``: how the reply's source takes
    tools and gives calls back (EngineTools, or remote_wire.OpenAITools for a remote)."""

    runner: ToolRunner
    tools: list[ToolInfo]
    forced: list[ToolInfo] = field(default_factory=list)
    always: set[str] = field(default_factory=set)
    wire: ToolWire = field(default_factory=EngineTools)
    max_rounds: int = MAX_ROUNDS
    calls: list[ToolCallRecord] = field(default_factory=list)
    decisions: dict[str, asyncio.Future] = field(default_factory=dict)  # call id -> decision
    shown: int = 0  # characters of reply text yielded so far (where a call sits)

    def first_round(self, request: GenerateRequest) -> GenerateRequest:
        """What the reply's first round asks: ``request``'s chat spelled out, with the tools
        offered (and the forced call), as the model reads it; fitting the chat counts this."""
        return self.wire.ask(request, spelled_out(request.messages or []), self.tools, self.forced)

    def waiting(self) -> list[ToolCallRecord]:
        """The calls that wait for the user's decision now (not those of the round that wait
        for the calls before them)."""
        return [c for c in self.calls if c.state == "waiting" and c.id in self.decisions]

    def decide(self, call_id: str, decision: str) -> bool:
        """The user's decision on a waiting call (one of DECISIONS); False if none waits."""
        if decision not in DECISIONS:
            raise ValueError(f"a decision is one of {', '.join(DECISIONS)}, not {decision!r}")
        future = self.decisions.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(decision)
        return True

    async def generate(
        self, request: GenerateRequest, stop: asyncio.Event, inner: Generate
    ) -> AsyncIterator[UserReply | PromptProgressMsg | ToolStep]:
        """The reply through every round: its text (tool-call blocks left out), the reply's
        calls as ToolSteps, and its end once the model answers without calling a tool."""
        messages = spelled_out(request.messages or [])
        spent = 0  # tokens of the rounds before
        for round_no in range(self.max_rounds + 1):
            forced = self.forced if round_no == 0 else []
            asked = self.wire.ask(request, messages, self.tools, forced)
            reader = self.wire.reader()
            content, found, last = "", [], None
            async for out in inner(asked, stop):
                if isinstance(out, PromptProgressMsg):
                    yield out
                    continue
                text, new = reader.push(out)
                found += new
                if not isinstance(out, UserReply):  # a remote's calls: no text of their own
                    continue
                content, last = content + text, out
                self.shown += len(text)
                yield UserReply(
                    out.uid,
                    text,
                    error=out.error,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=spent + out.completion_tokens,
                )
            if last is None or last.error or not last.finished or stop.is_set():
                return
            spent += last.completion_tokens
            if not found:
                yield UserReply(last.uid, "", True, last.finish_reason, completion_tokens=spent)
                return
            records = [self._record(call) for call in found]
            if round_no == self.max_rounds:
                self._settle(records, "denied", ROUND_LIMIT)
                yield ToolStep(tuple(self.calls))
                yield UserReply(last.uid, "", True, "stop", completion_tokens=spent)
                return
            yield ToolStep(tuple(self.calls))
            for record in records:
                async for step in self._run(record, stop):
                    yield step
                if stop.is_set():
                    return
            messages += call_turns(content, [self._current(r.id) for r in records])

    def _record(self, call) -> ToolCallRecord:
        key = next((tool_key(t) for t in self.tools if t.name == call.name), None)
        record = ToolCallRecord(call.id, key or f"?/{call.name}", call.arguments, self.shown)
        if key is None:
            record = replace(record, state="error", result=UNKNOWN_TOOL.format(name=call.name))
        self.calls.append(record)
        return record

    def _current(self, call_id: str) -> ToolCallRecord:
        return next(c for c in self.calls if c.id == call_id)

    def _set(self, call_id: str, **changes) -> None:
        i = next(i for i, c in enumerate(self.calls) if c.id == call_id)
        self.calls[i] = replace(self.calls[i], **changes)

    def _settle(self, records: list[ToolCallRecord], state: str, result: str) -> None:
        for record in records:
            if self._current(record.id).state == "waiting":
                self._set(record.id, state=state, result=result)

    async def _run(self, record: ToolCallRecord, stop: asyncio.Event) -> AsyncIterator[ToolStep]:
        """One call: the user's decision (unless always allowed), then the tool; Stop ends it."""
        if record.state != "waiting":
            return
        if record.tool not in self.always:
            decision = await self._decision(record.id, stop)
            if decision is None:
                self._set(record.id, state="stopped", result=STOPPED)
                yield ToolStep(tuple(self.calls))
                return
            if decision == DENY:
                self._set(record.id, state="denied", result=DENIED)
                yield ToolStep(tuple(self.calls))
                return
            if decision == ALLOW_ALWAYS:
                self.always.add(record.tool)
        self._set(record.id, state="running")
        yield ToolStep(tuple(self.calls))
        arguments = _arguments(record.arguments)
        if not isinstance(arguments, dict):
            result = ToolResult(f"the arguments are not a JSON object: {record.arguments}", True)
        else:
            result = await _until_stopped(self.runner.call(record.tool, arguments), stop)
        if result is None:
            self._set(record.id, state="stopped", result=STOPPED)
            yield ToolStep(tuple(self.calls))
            return
        self._set(record.id, state="error" if result.is_error else "done", result=result.text)
        yield ToolStep(tuple(self.calls))

    async def _decision(self, call_id: str, stop: asyncio.Event) -> str | None:
        """The user's decision on the call, None if Stop came first."""
        future = asyncio.get_running_loop().create_future()
        self.decisions[call_id] = future
        try:
            return await _until_stopped(future, stop)
        finally:
            self.decisions.pop(call_id, None)
