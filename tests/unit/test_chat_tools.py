"""Tools in chat replies (app/chat/tool_loop.py): the servers and the calls in the store, and one
reply's tool rounds: a call waits for the user's decision, runs (a real MCP server over stdio,
tests/mcp_test_server.py, for the ReplyManager test), and its result goes back to the model;
deny, always allow, Stop while waiting or while a tool runs, and the limit of rounds."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from minisgl_app.chat.live import ReplyManager, Turn
from minisgl_app.chat.mcp_tools import ToolInfo, ToolResult
from minisgl_app.chat.reply_request import tool_loop_for, tool_messages
from minisgl_app.chat.store import (
    ChatSettings,
    ConversationStore,
    ToolCallRecord,
)
from minisgl_app.chat.tool_loop import (
    DENIED,
    ROUND_LIMIT,
    STOPPED,
    EngineTools,
    ToolBox,
    ToolLoop,
    ToolStep,
    call_turns,
)
from minisgl_engine import GenerateRequest, SamplingParams, UserReply

SERVER = str(Path(__file__).parents[1] / "mcp_test_server.py")
ADD = ToolInfo("test", "add", "Add two whole numbers.", {"type": "object"})
SLOW = ToolInfo("test", "slow", "Wait.", {"type": "object"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.sqlite3") as s:
        yield s


class ToolModel:
    """A model that calls ``calls`` (one a round, in hermes tags), then answers with the last
    message it read; keeps each request it got."""

    def __init__(self, *calls: tuple[str, dict]) -> None:
        self.calls = list(calls)
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest, stop: asyncio.Event):
        self.requests.append(request)
        if self.calls:
            name, args = self.calls.pop(0)
            call = json.dumps({"name": name, "arguments": args})
            yield UserReply(1, "Let me see. <tool_call>", completion_tokens=3)
            yield UserReply(1, f"{call}</tool_call>", True, "stop", completion_tokens=9)
            return
        last = request.messages[-1]["content"]
        read = last.replace("<tool_response>", "").replace("</tool_response>", "").strip()
        yield UserReply(1, f"Read: {read}", True, "stop", completion_tokens=4)


class Runner:
    """Tools as plain functions: add, and slow (waits until cancelled)."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def call(self, key: str, arguments: dict) -> ToolResult:
        if key == "test/slow":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return ToolResult(str(arguments["a"] + arguments["b"]))


def request() -> GenerateRequest:
    return GenerateRequest(SamplingParams(), messages=[{"role": "user", "content": "2 + 40?"}])


async def run(loop: ToolLoop, model: ToolModel, stop: asyncio.Event | None = None) -> list:
    return [out async for out in loop.generate(request(), stop or asyncio.Event(), model.generate)]


async def decide_when_waiting(loop: ToolLoop, decision: str) -> None:
    while not loop.waiting():
        await asyncio.sleep(0.01)
    assert loop.decide(loop.waiting()[0].id, decision)


def text_of(outs: list) -> str:
    return "".join(o.incremental_output for o in outs if isinstance(o, UserReply))


# ---- the store


def test_tool_servers_are_stored_and_tool_calls_survive_reload_and_export(store, tmp_path):
    server = store.add_tool_server("local", command="python3", args=("s.py",), env={"K": "v"})
    store.add_tool_server("web", url="http://127.0.0.1:9/mcp")
    assert [s.name for s in store.tool_servers()] == ["local", "web"]
    assert store.tool_servers()[0] == server and server.env == {"K": "v"}
    with pytest.raises(ValueError, match="already"):
        store.add_tool_server("web", url="http://127.0.0.1:9/mcp")
    with pytest.raises(ValueError, match="not both"):
        store.add_tool_server("x", command="a", url="http://b")
    store.delete_tool_server(server.id)
    assert [s.name for s in store.tool_servers()] == ["web"]

    conv = store.create("tools", ChatSettings(tools=("test/add",), tool_choice="test/add"))
    store.append(conv.id, "user", "2 + 40?")
    reply = store.append(conv.id, "assistant", "")
    call = ToolCallRecord("call_1", "test/add", '{"a": 2, "b": 40}', 0, "done", "42")
    store.update_message(reply.id, "It is 42.", tool_calls=(call,))
    store.update_message(reply.id, "It is 42.")  # a later update keeps them
    assert store.get(conv.id).messages[-1].tool_calls == (call,)
    assert store.get(conv.id).settings.tool_choice == "test/add"
    copy = store.import_conversation(store.export_json(conv.id))
    assert copy.messages[-1].tool_calls == (call,)
    assert copy.settings.tools == ("test/add",)
    assert "`test/add`" in store.export_markdown(conv.id) and "42" in store.export_markdown(conv.id)


def test_a_tool_choice_must_be_one_of_the_chats_tools():
    assert ChatSettings(tool_choice="test/add").problems().keys() == {"tool_choice"}
    assert not ChatSettings(tools=("test/add",), tool_choice="test/add").problems()
    assert ChatSettings(tools=("add",)).problems().keys() == {"tools"}


def test_a_reply_with_calls_reads_back_as_call_and_tool_turns():
    call = ToolCallRecord("c1", "test/add", '{"a": 1, "b": 2}', 6, "done", "3")
    assert call_turns("Sure. It is 3.", [call]) == [
        {
            "role": "assistant",
            "content": "Sure. ",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "assistant", "content": "It is 3."},
    ]


# ---- one reply's tool rounds


@pytest.mark.anyio
async def test_a_forced_call_waits_for_allow_once_then_the_model_reads_its_result():
    model, loop = ToolModel(("add", {"a": 2, "b": 40})), ToolLoop(Runner(), [ADD], forced=[ADD])
    outs, _ = await asyncio.gather(run(loop, model), decide_when_waiting(loop, "once"))
    steps = [o.calls for o in outs if isinstance(o, ToolStep)]
    assert [c.state for c in steps[0]] == ["waiting"]
    assert (steps[-1][0].state, steps[-1][0].result, steps[-1][0].offset) == ("done", "42", 12)
    assert text_of(outs) == "Let me see. Read: 42", "the call's block is not in the text"
    first, second = model.requests
    assert first.params.grammar is not None and second.params.grammar is None, "forced once"
    assert "<tools>" in first.messages[0]["content"], "the default tool prompt"
    assert "<tool_response>\n42\n</tool_response>" in second.messages[-1]["content"]
    end = [o for o in outs if isinstance(o, UserReply)][-1]
    assert end.finished and end.finish_reason == "stop" and end.completion_tokens == 13


@pytest.mark.anyio
async def test_a_denied_call_is_fed_back_as_denied():
    model, loop = ToolModel(("add", {"a": 1, "b": 1})), ToolLoop(Runner(), [ADD])
    outs, _ = await asyncio.gather(run(loop, model), decide_when_waiting(loop, "deny"))
    assert (loop.calls[0].state, loop.calls[0].result) == ("denied", DENIED)
    assert text_of(outs).endswith(DENIED)


@pytest.mark.anyio
async def test_an_always_allowed_tool_runs_without_asking_and_always_sticks():
    model = ToolModel(("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2}))
    loop = ToolLoop(Runner(), [ADD])
    outs, _ = await asyncio.gather(run(loop, model), decide_when_waiting(loop, "always"))
    assert [c.result for c in loop.calls] == ["2", "4"], "the second call ran unasked"
    assert text_of(outs).endswith("Read: 4")


@pytest.mark.anyio
async def test_stop_while_a_tool_runs_cancels_it_and_while_waiting_ends_the_wait():
    runner = Runner()
    loop, stop = ToolLoop(runner, [SLOW], always={"test/slow"}), asyncio.Event()
    task = asyncio.create_task(run(loop, ToolModel(("slow", {"seconds": 60})), stop))
    while not loop.calls or loop.calls[0].state != "running":
        await asyncio.sleep(0.01)
    stop.set()
    await task
    assert runner.cancelled == 1 and (loop.calls[0].state, loop.calls[0].result) == (
        "stopped",
        STOPPED,
    )

    loop, stop = ToolLoop(Runner(), [ADD]), asyncio.Event()
    task = asyncio.create_task(run(loop, ToolModel(("add", {"a": 1, "b": 1})), stop))
    while not loop.waiting():
        await asyncio.sleep(0.01)
    stop.set()
    outs = await task
    assert loop.calls[0].state == "stopped" and isinstance(outs[-1], ToolStep)


@pytest.mark.anyio
async def test_calls_past_the_round_limit_are_not_run():
    model = ToolModel(*[("add", {"a": i, "b": 0}) for i in range(3)])
    loop = ToolLoop(Runner(), [ADD], always={"test/add"}, max_rounds=2)
    outs = await run(loop, model)
    assert [c.state for c in loop.calls] == ["done", "done", "denied"]
    assert loop.calls[-1].result == ROUND_LIMIT
    assert outs[-1].finished


# ---- a reply in a chat, with a real MCP server


class LocalSource:
    """What tool_loop_for asks of the chat's source: how tools reach its model (this machine's
    engine, whose template knows no tools)."""

    tool_wire = EngineTools(None)


@pytest.mark.anyio
async def test_a_chat_reply_runs_a_real_mcp_tool_after_allow_and_stores_the_call(store, tmp_path):
    box = ToolBox()
    record = store.add_tool_server(
        "test", command=sys.executable, args=(SERVER, str(tmp_path / "pid"))
    )
    assert {t.name for t in await box.start(record)} == {"add", "slow", "fail", "hang"}
    pid = int((tmp_path / "pid").read_text())
    try:
        settings = ChatSettings(tools=("test/add",), tool_choice="test/add")
        conv = store.create("tools", settings)
        store.append(conv.id, "user", "2 + 40?")
        model = ToolModel(("add", {"a": 2, "b": 40}))
        manager = ReplyManager(store, model.generate)

        def make_turn() -> Turn:
            c = store.get(conv.id)
            req = GenerateRequest(SamplingParams(), messages=[])
            req, loop = tool_loop_for(c, c.messages, req, box, LocalSource())
            return Turn(req, store.append(conv.id, "assistant", "").id, tool_loop=loop)

        manager.submit(conv.id, "tab", make_turn)
        while not manager.live[conv.id].tool_calls:
            await asyncio.sleep(0.01)
        call = manager.live[conv.id].tool_calls[0]
        assert store.get(conv.id).messages[-1].tool_calls[0].state == "waiting", "stored at once"
        assert manager.decide(conv.id, call.id, "once")
        while manager.busy_conversations():
            await asyncio.sleep(0.01)
        reply = store.get(conv.id).messages[-1]
        assert reply.content == "Let me see. Read: 42"
        assert [(c.tool, c.state, c.result) for c in reply.tool_calls] == [
            ("test/add", "done", "42")
        ]
        again = tool_messages(store.get(conv.id), settings)
        assert [m["role"] for m in again] == ["user", "assistant", "tool", "assistant"]
    finally:
        await box.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.anyio
async def test_tools_are_offered_only_where_they_run_and_the_source_can_call_them(store):
    conv = store.create("t", replace(ChatSettings(), tools=("test/add",)))
    req = GenerateRequest(SamplingParams(), messages=[])
    box = ToolBox()
    assert tool_loop_for(conv, [], req, box, LocalSource()) == (req, None), "server not running"
    box.tools["test"] = [ADD]
    assert tool_loop_for(conv, [], req, box, object())[1] is None, "a remote calls no tools"
    assert tool_loop_for(conv, [], req, box, LocalSource())[1].tools == [ADD]


# ---- what the page shows


def test_a_reply_shows_each_call_as_a_collapsed_line_where_it_was_made(store):
    from minisgl_app.chat.view import view_messages
    from minisgl_app.page.page_view import Picked, as_update

    conv = store.create("tools")
    store.append(conv.id, "user", "2 + 40?")
    reply = store.append(conv.id, "assistant", "")
    call = ToolCallRecord("c1", "test/add", '{"a": 2, "b": 40}', 6, "done", "42")
    store.update_message(reply.id, "Sure. It is 42.", tool_calls=(call,))
    shown = [v.shown for v in view_messages(store.get(conv.id))][1:4]
    assert [s.get("metadata", {}).get("title") for s in shown] == [None, "🔧 test/add · done", None]
    assert "42" in shown[1]["content"] and '{"a": 2, "b": 40}' in shown[1]["content"]
    update = as_update("chat_tools", Picked(("test/add", "test/slow"), ("test/add",)))
    assert update["value"] == ["test/add"], "a checkbox group's value is a list"


def test_a_settings_form_saved_keeps_the_chats_tools():
    from minisgl_app.chat.settings_form import with_backend_of

    in_force = ChatSettings(tools=("test/add",), always_allow=("test/add",), tool_choice="test/add")
    saved = with_backend_of(ChatSettings(temperature=0.0), in_force)
    assert (saved.tools, saved.always_allow, saved.tool_choice, saved.temperature) == (
        ("test/add",),
        ("test/add",),
        "test/add",
        0.0,
    )


# ---- a remote's tools


def test_a_remotes_streamed_tool_call_pieces_are_joined_into_one_call():
    from openai.types.chat import ChatCompletionChunk

    from minisgl_app.chat.remote_wire import ReplyTally

    def chunk(delta: dict, finish: str | None = None) -> ChatCompletionChunk:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return ChatCompletionChunk.model_validate(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [choice],
            }
        )

    def piece(**function) -> dict:
        return {"index": 0, "id": "call_1" if "name" in function else None, "function": function}

    tally = ReplyTally()
    assert tally.add(chunk({"content": "Let me add. "})) == "Let me add. "
    tally.add(chunk({"tool_calls": [piece(name="add", arguments='{"a": 2, ')]}))
    tally.add(chunk({"tool_calls": [piece(arguments='"b": 40}')]}, "tool_calls"))
    [call] = tally.calls().calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("call_1", "add", {"a": 2, "b": 40})
    assert tally.ended("the remote").finish_reason == "stop"


def test_a_remote_reads_the_chats_calls_as_openai_messages_with_a_forced_tool():
    from minisgl_app.chat.remote_wire import OpenAITools

    turns = call_turns(
        "Sum: ", [ToolCallRecord("c1", "test/add", '{"a": 1, "b": 1}', 5, "done", "2")]
    )
    asked = OpenAITools().ask(request(), request().messages + turns, [ADD], [ADD])
    assert asked.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert asked.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 1}'
    assert asked.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "2"}
    assert OpenAITools().ask(request(), [], [ADD], []).tool_choice == "auto"


# ---- a streamable-HTTP MCP server


@pytest.mark.anyio
async def test_a_streamable_http_server_added_by_url_lists_and_runs_its_tools(store, tmp_path):
    import socket
    import subprocess

    from server_utils import wait_until

    from minisgl_engine import free_port

    port = free_port()
    log = (tmp_path / "mcp-http.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port)], stdout=log, stderr=subprocess.STDOUT
    )

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    box = ToolBox()
    try:
        assert await asyncio.to_thread(wait_until, listening, 30), "the HTTP server did not start"
        record = store.add_tool_server("web", url=f"http://127.0.0.1:{port}/mcp")
        assert [(r.name, r.url) for r in store.tool_servers()] == [("web", record.url)]
        assert {t.name for t in await box.start(record)} == {"add", "slow", "fail", "hang"}
        assert await box.call("web/add", {"a": 2, "b": 40}) == ToolResult("42")
        failed = await box.call("web/fail", {"reason": "no network"})
        assert failed.is_error and "no network" in failed.text
        await box.stop("web")
        assert await box.call("web/add", {"a": 1, "b": 1}) == ToolResult(
            "the MCP server 'web' is not running", True
        )
    finally:
        await box.close()
        proc.terminate()
        proc.wait(10)
        log.close()


def test_the_markdown_export_places_each_call_where_the_model_made_it(store):
    conv = store.create("tools")
    store.append(conv.id, "user", "2 + 40, then 1 + 1?")
    reply = store.append(conv.id, "assistant", "")
    text = "Let me add.\nFirst: 42. Then: 2."
    first = ToolCallRecord(
        "c1", "test/add", '{"a": 2, "b": 40}', len("Let me add.\n"), "done", "42"
    )
    second = ToolCallRecord("c2", "test/add", '{"a": 1, "b": 1}', len(text) - 2, "done", "2")
    store.update_message(reply.id, text, tool_calls=(first, second))
    md = store.export_markdown(conv.id)
    order = [md.index(s) for s in ("Let me add.", '"b": 40', "First: 42. Then:", '"b": 1}', "2.\n")]
    assert order == sorted(order), md
    assert md.count("**Tool call** `test/add` (done):") == 2
