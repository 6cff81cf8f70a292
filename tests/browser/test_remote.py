"""`minisgl-chat --remote URL`: the chat page with no engine of its own, its replies streamed from
a real OpenAI-compatible server (our own `minisgl-chat serve --api-key`, demo model, CPU), in
Chromium: a streamed reply with its stats, Stop aborting the request on the remote, a chat's MCP
tool called by the remote's model after approval, a wrong key, and the remote killed mid-reply
then back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import time

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    LINE,
    add_test_tool_server,
    ask_and_wait_for_approval,
    browser,
    chat_lines,
    open_new_chat,
    pick_tool,
    remove_tool_server,
    send,
    status_text,
    wait_page_loaded,
)
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from server_utils import ServerProcess, wait_until
from test_browser import BOT, last_reply, make_greedy, stats_text

KEY = "r3mote"


# ---- the pieces, without a server ----------------------------------------------------------


def test_a_chat_turn_becomes_an_openai_streamed_request():
    from minisgl_app.chat.reply_source import chat_body
    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    request = GenerateRequest(
        params=SamplingParams(
            max_tokens=64, temperature=0.5, top_p=0.9, top_k=20, seed=3, stop=["END"]
        ),
        messages=[{"role": "user", "content": "hi"}],
        chat_template_kwargs={"enable_thinking": False},
    )
    body = chat_body(request, "m")
    assert (
        body["model"] == "m"
        and body["stream"]
        and body["stream_options"] == {"include_usage": True}
    )
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        64,
        0.5,
        0.9,
        3,
        ["END"],
    )
    assert body["extra_body"] == {"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}
    plain = chat_body(GenerateRequest(params=SamplingParams(max_tokens=8), messages=[]), "m")
    assert (
        "extra_body" not in plain and "seed" not in plain and "stop" not in plain
    )  # nothing a plain OpenAI server refuses


def test_reasoning_sent_apart_is_shown_as_a_think_block():
    from minisgl_app.chat.reply_source import ReasoningJoiner
    from minisgl_app.chat.view import split_thinking

    joiner = ReasoningJoiner()
    text = "".join(
        [
            joiner.push(None, "Let me"),
            joiner.push(None, " think."),
            joiner.push("Paris", None),
            joiner.push(" it is.", None),
            joiner.close(),
        ]
    )
    assert text == "<think>Let me think.</think>Paris it is."
    assert split_thinking(text) == [("Let me think.", True, False), ("Paris it is.", False, False)]
    cut = ReasoningJoiner()
    assert (
        cut.push(None, "half") + cut.close() == "<think>half</think>"
    )  # a reply stopped mid-thought still closes


def test_an_unreachable_remote_is_a_sentence_not_a_traceback():
    from server_utils import free_port

    from minisgl_app.chat.reply_source import RemoteEngine
    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    port = free_port()
    remote = RemoteEngine(
        f"http://127.0.0.1:{port}/v1/"
    )  # with or without /v1: the server's address
    assert remote.url == f"http://127.0.0.1:{port}"

    async def ask() -> list:
        request = GenerateRequest(
            params=SamplingParams(max_tokens=4), messages=[{"role": "user", "content": "hi"}]
        )
        return [out async for out in remote.generate(request, asyncio.Event())]

    [out] = asyncio.run(ask())
    assert (
        out.finished and "cannot connect; is it running?" in out.error and remote.url in out.error
    )
    assert remote.status_line().startswith("**Remote unavailable**")


def test_engine_flags_beside_remote_are_one_line_and_exit_2():
    """--remote runs no engine: --model or --tp beside it would be silently ignored; say so."""
    import subprocess

    from server_utils import CLI

    out = subprocess.run(
        [
            *CLI,
            "chat",
            "--no-browser",
            "--remote",
            "http://127.0.0.1:9",
            "--model",
            "Qwen/Qwen3-8B",
            "--tp",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    [line] = out.stderr.strip().splitlines()
    assert (
        line.startswith("minisgl-chat: error: --remote runs no local engine")
        and "--model, --tp" in line
    ), line
    assert "add --local" in line, line
    # and --local without a remote to stand beside, or a remote that is no URL
    for args, said in (
        (["--local"], "--local goes with --remote URL"),
        (["--remote", "gpu-box:30000", "--local"], "--remote must be an http"),
    ):
        out = subprocess.run(
            [*CLI, "chat", "--no-browser", *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [out.stderr.strip()], out
        assert out.stderr.startswith(f"minisgl-chat: error: {said}"), out.stderr


def test_continue_and_credentials():
    """Continue goes as vLLM's and SGLang's top-level fields (this engine reads them too); an
    address's user:password never reaches the page."""
    from minisgl_app.chat.reply_source import chat_body, without_credentials
    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    request = GenerateRequest(
        params=SamplingParams(max_tokens=8),
        messages=[{"role": "assistant", "content": "Once"}],
        chat_template_kwargs={"continue_final_message": True, "enable_thinking": False},
    )
    assert chat_body(request, "m")["extra_body"] == {
        "continue_final_message": True,
        "add_generation_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert without_credentials("https://me:s3cret@gpu-box:8443") == "https://gpu-box:8443"
    assert without_credentials("http://[::1]:30000") == "http://[::1]:30000"


# ---- a remote that misbehaves on purpose (a fake OpenAI server in this process) ----------------


def sse(chunk: dict) -> str:
    import json

    return f"data: {json.dumps(chunk)}\n\n"


def chunk(content=None, finish=None, usage=None, **delta) -> dict:
    choice = {"index": 0, "delta": {"content": content, **delta}, "finish_reason": finish}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [choice],
        "usage": usage,
    }


SCENARIOS = {  # model name -> what the fake remote streams
    # vLLM's current field name for a thinking model's reasoning, then the answer; usage only at the end
    "thinks": [
        chunk(reasoning="Let me"),
        chunk(reasoning=" see."),
        chunk("Paris"),
        chunk(".", finish="stop"),
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "fake",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        },
    ],
    # usage in every chunk (vLLM's continuous usage stats): the count is the remote's, not one more
    "counts": [
        chunk("a", usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        chunk(
            "b",
            finish="length",
            usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        ),
    ],
    "aborts": [chunk("Half"), chunk(None, finish="abort")],  # SGLang/vLLM end an aborted request so
    "drops": [chunk(reasoning="Thinking"), chunk(reasoning=" hard")],  # then the connection breaks
}


@pytest.fixture(scope="module")
def fake_remote():
    """A fake OpenAI-compatible server on a thread: /v1/models and a streamed /v1/chat/completions
    playing the scenario its `model` names."""
    import threading

    import uvicorn
    from server_utils import free_port

    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "x"} for name in SCENARIOS
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        scenario = (await request.json())["model"]

        async def events():
            for piece in SCENARIOS[scenario]:
                yield sse(piece)
            if scenario == "drops":
                raise RuntimeError("the remote died")  # uvicorn cuts the connection mid-stream
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_until(lambda: server.started, 30)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def reply_from(url: str, model: str) -> tuple[str, list]:
    """The text the page would store, and the replies, for one chat turn to ``model``."""
    from minisgl_app.chat.reply_source import RemoteEngine
    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    async def ask() -> list:
        remote = RemoteEngine(url, model=model)
        try:
            request = GenerateRequest(
                params=SamplingParams(max_tokens=16), messages=[{"role": "user", "content": "hi"}]
            )
            return [out async for out in remote.generate(request, asyncio.Event())]
        finally:
            await remote.close()

    outs = asyncio.run(ask())
    return "".join(o.incremental_output for o in outs), outs


def test_reasoning_in_vllms_field_is_a_think_block_and_usage_counts(fake_remote):
    text, outs = reply_from(fake_remote, "thinks")
    assert text == "<think>Let me see.</think>Paris.", outs
    assert (
        outs[-1].finished,
        outs[-1].finish_reason,
        outs[-1].error,
        outs[-1].completion_tokens,
    ) == (True, "stop", None, 9)


def test_usage_in_every_chunk_is_taken_as_the_count(fake_remote):
    _, outs = reply_from(fake_remote, "counts")
    assert [o.completion_tokens for o in outs] == [1, 2, 2] and outs[-1].finish_reason == "length"


def test_an_aborted_finish_is_a_failure_not_an_ending(fake_remote):
    text, outs = reply_from(fake_remote, "aborts")
    assert text == "Half" and outs[-1].finish_reason is None
    assert outs[-1].error.endswith("it ended the reply (abort)")


def test_a_connection_cut_mid_thought_closes_the_block_and_says_so(fake_remote):
    text, outs = reply_from(fake_remote, "drops")
    assert text == "<think>Thinking hard</think>", text
    assert outs[-1].error.endswith("the connection broke mid-reply"), outs[-1].error


# ---- against a real server, in the browser ---------------------------------------------------


def browser_test(fn):
    """Chromium and the demo model are needed (skipped, saying which, where they are missing)."""
    for mark in BROWSER_MARKS:
        fn = mark(fn)
    return fn


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """The remote engine: `minisgl-chat serve` of the demo model with an API key."""
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    folder = tmp_path_factory.mktemp("remote")
    holder = {
        "srv": ServerProcess(
            "--api-key", KEY, "--max-kv-tokens", "8192", log_path=folder / "remote.log"
        ),
        "folder": folder,
    }
    yield holder
    holder["srv"].stop()


def start_app(tmp_path_factory, remote_srv: ServerProcess, key: str, name: str) -> ServerProcess:
    folder = tmp_path_factory.mktemp(name)
    return ServerProcess(
        "--no-browser",
        "--remote",
        remote_srv.url,
        "--remote-api-key",
        key,
        command="chat",
        log_path=folder / "app.log",
        env={"MINISGL_DATA_DIR": str(folder / "data")},
    )


@pytest.fixture(scope="module")
def app(remote, tmp_path_factory):
    srv = start_app(tmp_path_factory, remote["srv"], KEY, "remote-app")
    yield srv
    srv.stop()


def open_remote_page(browser, app: ServerProcess, status: str = "Remote"):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.goto(app.page_url)
    wait_page_loaded(page, status, 30)
    return page


def new_greedy_chat(page, max_tokens: int) -> None:
    open_new_chat(page)
    make_greedy(page, max_tokens)


def engine_figures(srv: ServerProcess) -> dict[str, float]:
    m = srv.metrics()
    return {
        k.removeprefix("minisgl_"): m[k]
        for k in (
            "minisgl_running_requests",
            "minisgl_kv_pages_used",
            "minisgl_requests_aborted_total",
            "minisgl_requests_finished_total",
        )
    }


@browser_test
def test_the_page_streams_a_remote_reply_with_its_figures(browser, app, remote):  # noqa: F811
    srv = remote["srv"]
    page = open_remote_page(browser, app)
    status = status_text(page)
    assert "smollm2" in status.lower() and srv.url in status, status
    before = engine_figures(srv)
    new_greedy_chat(page, 32)
    send(page, "What is the capital of France?")
    assert wait_until(lambda: "tok/s" in stats_text(page), 60), (last_reply(page), stats_text(page))
    assert "Paris" in last_reply(page)
    assert "s to first token" in stats_text(page) and "tokens" in stats_text(page)
    after = engine_figures(srv)
    assert after["requests_finished_total"] == before["requests_finished_total"] + 1, (
        before,
        after,
    )
    page.close()


@browser_test
def test_stop_aborts_the_request_on_the_remote_and_frees_its_kv(browser, app, remote):  # noqa: F811
    srv = remote["srv"]
    page = open_remote_page(browser, app)
    before = engine_figures(srv)
    new_greedy_chat(page, 1024)
    send(page, "Write a very long story about a dragon who learns to cook. Use many chapters.")
    assert wait_until(lambda: len(last_reply(page)) >= 20, 60), last_reply(page)
    page.click("#stop-btn")
    start = time.monotonic()
    freed = wait_until(
        lambda: (
            engine_figures(srv)["running_requests"] == 0
            and engine_figures(srv)["kv_pages_used"] == 0
        ),
        2.0,
    )
    print(f"remote freed the request {time.monotonic() - start:.2f} s after Stop")
    after = engine_figures(srv)
    assert freed, after
    assert after["requests_aborted_total"] == before["requests_aborted_total"] + 1, (before, after)
    assert wait_until(lambda: "stopped" in stats_text(page), 10), stats_text(page)
    page.close()


@browser_test
def test_a_remote_chat_calls_the_pages_mcp_tool_after_approval_and_goes_on(
    browser,  # noqa: F811
    app,
    remote,
    tmp_path,
):
    """The tools are the page's (the MCP server runs beside the page), the model is the
    remote's: the forced call of add shows, waits for Allow once, runs here, and its result
    goes back to the remote, which answers a second request."""
    srv = remote["srv"]
    page = open_remote_page(browser, app)
    new_greedy_chat(page, 64)  # room for a call (the grammar lets the model write a long number)
    add_test_tool_server(page, tmp_path / "pid")
    try:
        pick_tool(page, "test/add")
        before = engine_figures(srv)
        ask_and_wait_for_approval(page, "What is 2 + 40?", "test/add")
        page.click("#allow-once-btn")
        assert wait_until(lambda: "test/add · done" in chat_lines(page), 180), chat_lines(page)
        assert wait_until(lambda: "tokens" in stats_text(page), 180), stats_text(page)
        after = engine_figures(srv)
        rounds = after["requests_finished_total"] - before["requests_finished_total"]
        assert rounds == 2, "the call's round, then the answer with its result"
        page.locator(LINE, has_text="test/add · done").locator("button").first.click()
        opened = page.locator(LINE, has_text="test/add · done").inner_text()
        found = re.search(r"Arguments:\s*(\{.*?\})\s*Result:\s*(-?\d+)", opened, re.S)
        assert found, opened
        arguments = json.loads(found.group(1))
        assert int(found.group(2)) == arguments["a"] + arguments["b"], opened
    finally:  # the later tests' chats (new ones start from this one's settings) call no tool
        remove_tool_server(page)
        page.close()


@browser_test
def test_local_and_remote_side_by_side_each_chat_picks_where_its_replies_come_from(
    browser, remote, tmp_path_factory
):  # noqa: F811
    """`--remote URL --local`: this machine serves a tiny model (the demo tokenizer), the remote
    the demo model; a chat on each, the status line following the chat shown."""
    import shutil

    import httpx
    from tiny_models import make_tiny_chat_model

    from minisgl_engine.weights.demo import demo_model_dir

    srv, folder = remote["srv"], tmp_path_factory.mktemp("side-by-side")
    tiny = shutil.copytree(
        make_tiny_chat_model(folder / "hub", "test/tiny-chat", demo_model_dir()),
        folder / "tiny-local",
    )
    both = ServerProcess(
        "--no-browser",
        "--remote",
        srv.url,
        "--remote-api-key",
        KEY,
        "--local",
        "--model",
        str(tiny),
        "--max-kv-tokens",
        "4096",
        command="chat",
        log_path=folder / "app.log",
        env={"MINISGL_DATA_DIR": str(folder / "data")},
    )
    try:
        local_model = httpx.get(f"{both.url}/v1/models", timeout=5).json()["data"][0]["id"]
        page = open_remote_page(browser, both, status="Ready")
        before = engine_figures(srv)
        new_greedy_chat(page, 8)  # on this machine: the first backend
        choices = page.locator("#backend label").all_inner_texts()
        assert [c.split(" · ")[0] for c in choices] == ["This machine", "Remote"] and srv.url.split(
            "://"
        )[1] in choices[1], choices
        send(page, "Hello there")
        assert wait_until(lambda: "tok/s" in stats_text(page), 60), (
            last_reply(page),
            stats_text(page),
        )
        assert local_model in stats_text(page) and "SmolLM2" not in stats_text(page), stats_text(
            page
        )
        local_chat_title = page.locator("#conv-list label").first.inner_text()
        # a new chat keeps the backend; this one picks the remote
        new_greedy_chat(page, 32)
        page.locator("#backend label", has_text="Remote").click()
        assert wait_until(lambda: "Remote ·" in status_text(page), 15), status_text(page)
        send(page, "What is the capital of France?")
        assert wait_until(lambda: "tok/s" in stats_text(page), 60), (
            last_reply(page),
            stats_text(page),
        )
        assert "Paris" in last_reply(page) and "SmolLM2" in stats_text(page), (
            last_reply(page),
            stats_text(page),
        )
        assert (
            engine_figures(srv)["requests_finished_total"] == before["requests_finished_total"] + 1
        )
        # the first chat shown again: its backend and its status line
        page.locator("#conv-list label", has_text=local_chat_title.split(" · ")[0]).click()
        assert wait_until(
            lambda: "Ready" in status_text(page) and "Remote" not in status_text(page),
            15,
        ), status_text(page)
        assert page.locator("#backend input:checked").input_value() == "local"
        # the models panel marks what each side serves
        page.get_by_text("Models", exact=True).first.click()
        assert wait_until(lambda: page.locator("#model-list label").count() >= 2, 15)
        marked = [
            t for t in page.locator("#model-list label").all_inner_texts() if t.startswith("●")
        ]
        assert (
            len(marked) == 2
            and local_model in marked[0]
            and marked[1].startswith("● remote: ")
            and "SmolLM2" in marked[1]
        ), marked
        page.close()
    finally:
        both.stop()
    # each stored reply remembers the model that wrote it (the remote's, learnt with its first reply)
    from minisgl_app.chat.store import ConversationStore

    with ConversationStore(folder / "data" / "chats.sqlite3") as store:
        models = [store.get(c.id).messages[-1].model for c in store.list()]
    assert (
        len(models) == 2
        and local_model in models
        and any(m is not None and "SmolLM2" in m for m in models)
    ), models


@browser_test
def test_a_wrong_key_is_a_message_in_the_chat(browser, remote, tmp_path_factory):  # noqa: F811
    wrong = start_app(tmp_path_factory, remote["srv"], "not-the-key", "remote-wrong-key")
    try:
        page = open_remote_page(browser, wrong, status="Remote unavailable")
        assert "API key" in status_text(page)
        send(page, "Hello?")
        assert wait_until(lambda: "⚠️" in last_reply(page), 30), last_reply(page)
        assert "refused the API key (HTTP 401)" in last_reply(
            page
        ) and "--remote-api-key" in last_reply(page)
        assert "Traceback" not in wrong.output()
        page.close()
    finally:
        wrong.stop()


@browser_test
def test_the_remote_killed_mid_reply_then_back(browser, app, remote):  # noqa: F811
    """Last in this module: it kills the module's remote (then starts it again on its port)."""
    srv = remote["srv"]
    page = open_remote_page(browser, app)
    new_greedy_chat(page, 1024)
    send(page, "Tell me a long tale about a lighthouse keeper and a storm, with many details.")
    assert wait_until(lambda: len(last_reply(page)) >= 20, 60), last_reply(page)
    srv.proc.kill()  # SIGKILL: the remote's workers follow it (tests/server/test_server.py)
    srv.proc.wait(10)
    assert wait_until(lambda: "⚠️" in last_reply(page), 30), page.locator(BOT).all_inner_texts()
    reply = last_reply(page)
    assert len(reply.split("⚠️")[0].strip()) >= 20, reply  # the text that came before stays
    assert "the remote at" in reply and "Traceback" not in reply, reply
    assert wait_until(lambda: "Remote unavailable" in status_text(page), 15), status_text(page)
    # back on the same address: the page says so and the next message is answered
    remote["srv"] = ServerProcess(
        "--api-key",
        KEY,
        "--max-kv-tokens",
        "8192",
        port=srv.port,
        log_path=remote["folder"] / "remote-again.log",
    )
    assert wait_until(lambda: "Remote ·" in status_text(page), 15), status_text(page)
    new_greedy_chat(page, 32)
    send(page, "What is the capital of France?")
    assert wait_until(lambda: "tok/s" in stats_text(page), 60), (last_reply(page), stats_text(page))
    assert "Paris" in last_reply(page)
    assert app.proc.poll() is None  # the app kept running throughout
    page.close()


def test_the_models_panel_lists_the_remotes_models_and_a_switch_changes_the_name_asked(fake_remote):
    from minisgl_app.chat.reply_source import ModelError, RemoteEngine

    async def panel() -> tuple:
        remote = RemoteEngine(fake_remote, model="thinks")
        try:
            listed = [(e.name, e.where) for e in await remote.list_models()]
            with pytest.raises(ModelError, match="does not serve `nope`"):
                await remote.switch_model("nope")
            before = remote.model_name
            await remote.switch_model("counts")
            request = GenerateRequest(
                params=SamplingParams(max_tokens=16), messages=[{"role": "user", "content": "hi"}]
            )
            text = "".join(
                [o.incremental_output async for o in remote.generate(request, asyncio.Event())]
            )
            return listed, before, remote.model_name, text
        finally:
            await remote.close()

    from minisgl_engine.sampling_params import SamplingParams
    from minisgl_engine.workers.frontend import GenerateRequest

    # its own thread: a module's Playwright (sync API) keeps an event loop running in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        listed, before, after, text = pool.submit(asyncio.run, panel()).result()
    assert listed == [(name, "remote") for name in SCENARIOS]
    assert (before, after, text) == ("thinks", "counts", "ab")  # the "counts" scenario's reply
