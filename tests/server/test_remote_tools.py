"""A chat's MCP tools with a remote engine (``--remote``): the tools are the page's (a real stdio
MCP server run here), the model is another process's (a real `minisgl-chat serve` of the demo
model, reached over HTTP as an OpenAI server). The request carries ``tools`` and
``tool_choice``, the streamed ``tool_calls`` come back as the call the user approves, and its
result goes back to the remote as a ``tool`` message."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from minisgl_app.chat.live import ReplyManager, Turn
from minisgl_app.chat.remote_wire import ToolsRequest
from minisgl_app.chat.reply_request import reply_request, tool_loop_for
from minisgl_app.chat.reply_source import RemoteEngine
from minisgl_app.chat.store import ChatSettings, ConversationStore
from minisgl_app.chat.tool_loop import ToolBox

SERVER = str(Path(__file__).parent.parent / "mcp_test_server.py")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_remote_model_calls_a_page_tool_after_approval_and_reads_its_result(
    demo_server, tmp_path
):
    box = ToolBox()
    remote = RemoteEngine(demo_server.url)
    asked: list[ToolsRequest] = []

    def generate(request, stop):  # the remote's own, keeping what each round asked
        asked.append(request)
        return remote.generate(request, stop)

    with ConversationStore(tmp_path / "chats.sqlite3") as store:
        try:
            await box.start(store.add_tool_server("test", command=sys.executable, args=(SERVER,)))
            settings = ChatSettings(
                tools=("test/add",), tool_choice="test/add", temperature=0.0, max_tokens=64
            )
            conv = store.create("tools", settings)
            store.append(conv.id, "user", "What is 2 + 40? Use the add tool.")
            manager = ReplyManager(store, generate)

            def make_turn() -> Turn:
                c = store.get(conv.id)
                req = reply_request(c, c.messages, remote, continuing=False)
                req, loop = tool_loop_for(c, c.messages, req, box, remote)
                assert loop is not None, "a remote chat gets its tools"
                return Turn(req, store.append(conv.id, "assistant", "").id, tool_loop=loop)

            manager.submit(conv.id, "tab", make_turn)
            while not (live := manager.live.get(conv.id)) or not live.tool_calls:
                assert manager.busy_conversations(), store.get(conv.id).messages[-1].content
                await asyncio.sleep(0.05)  # until the call is shown, waiting for the user
            call = live.tool_calls[0]
            assert (call.tool, call.state) == ("test/add", "waiting")
            arguments = json.loads(call.arguments)
            assert set(arguments) == {"a", "b"}, (
                "the remote's grammar holds the call to add's schema"
            )
            assert manager.decide(conv.id, call.id, "once")
            while manager.busy_conversations():
                await asyncio.sleep(0.05)
        finally:
            await box.close()
            await remote.close()
        reply = store.get(conv.id).messages[-1]

    total = str(arguments["a"] + arguments["b"])
    assert [(c.tool, c.state, c.result) for c in reply.tool_calls] == [("test/add", "done", total)]
    assert reply.stats.finish_reason in ("stop", "length") and "⚠" not in reply.content
    first, second = asked
    assert first.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert [t["function"]["name"] for t in first.tools] == ["add"]
    assert second.tool_choice == "auto", "only the first round is forced"
    call_turn, result_turn = second.messages[-2:]
    assert call_turn["tool_calls"][0]["function"] == {"name": "add", "arguments": call.arguments}
    assert result_turn == {"role": "tool", "tool_call_id": call.id, "content": total}
    assert reply.content[reply.tool_calls[0].offset :].strip(), "the reply goes on after the call"
