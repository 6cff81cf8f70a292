"""The models panel (issue 16 item 1): what it lists (tiny folders in a temporary cache, no
browser), and in Debian's Chromium against the real app (`minisgl-chat chat`, real workers over
ZeroMQ): switching from the demo model to a tiny local model and back while another tab streams,
and models that fail leaving the demo model serving; a pull from the page (progress, Cancel, a
failure, then a model pulled and served). Nothing reaches the real hub: the app's HF_ENDPOINT is
tests/fake_hub.py on loopback, serving the test models, and its Hugging Face cache is a temporary
folder that already holds all of them but the one to pull."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    LINE,
    REPLY,
    browser,
    engine_idle,
    open_new_chat,
    put_setting,
    send,
    status_text,
    wait_page_loaded,
)
from fake_hub import FakeHub
from server_utils import ServerProcess, served_model, wait_until
from tiny_models import make_tiny_chat_model, make_unsupported_model

DEMO = "SmolLM2-135M-Instruct"
TINY = "test/tiny-chat"
BROKEN = "test/tiny-broken"  # passes every check before the switch, fails as its scheduler loads it
UNSUPPORTED = "test/gpt2-unsupported"
PULLED = "test/tiny-pulled"  # on the fake hub only, until the page pulls it


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# ---- the listing (no app)


def fake_folder(folder: Path, config: dict, weights: int = 1000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * weights)
    return folder


def test_local_models_lists_the_demo_hub_ids_and_converted_gguf_files(tmp_path, monkeypatch):
    from huggingface_hub import constants
    from tiny_models import hub_snapshot_dir

    from minisgl_engine import local_models

    cache, hub = tmp_path / "cache", tmp_path / "hub"
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    demo = fake_folder(
        cache / "models" / "smollm2-135m-instruct",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "max_position_embeddings": 8192,
        },
        5000,
    )
    from minisgl_engine.weights.gguf_convert import LAYOUT

    (demo / ".complete").write_text(json.dumps({"layout": LAYOUT}))
    fake_folder(
        hub_snapshot_dir(hub, "Qwen/Qwen3-0.6B"),
        {"model_type": "qwen3", "max_position_embeddings": 40960},
        2000,
    )
    gguf = fake_folder(
        cache / "models" / "gguf-0123456789abcdef", {"architectures": ["MistralForCausalLM"]}
    )
    (gguf / ".complete").write_text(json.dumps({"layout": LAYOUT, "source": "tiny.Q4_0.gguf"}))
    (gguf / "model.safetensors").unlink()
    (gguf / "model.gguf").write_bytes(b"\0" * 3000)  # a GGUF kept as it is (the demo's layout)
    fake_folder(
        cache / "models" / "gguf-unfinished", {"model_type": "llama"}
    )  # no marker: a conversion cut short
    older = fake_folder(
        cache / "models" / "gguf-float32", {"model_type": "llama"}
    )  # an older layout: made again when used
    (older / ".complete").write_text(json.dumps({"source": "old.Q4_0.gguf"}))
    (hub / "models--broken--no-config" / "snapshots" / "x").mkdir(
        parents=True
    )  # a download cut short
    (hub_snapshot_dir(hub, "cut/before-the-weights") / "config.json").write_text(
        json.dumps({"model_type": "llama"})
    )  # a cancelled pull
    found = {m.name: m for m in local_models()}
    assert list(found) == [DEMO, "Qwen/Qwen3-0.6B", "tiny.Q4_0"]
    assert (
        found[DEMO].model,
        found[DEMO].size_bytes,
        found[DEMO].architecture,
        found[DEMO].context_len,
    ) == ("demo", 5000, "LlamaForCausalLM", 8192)
    qwen = found["Qwen/Qwen3-0.6B"]
    assert (qwen.kind, qwen.architecture, qwen.context_len, Path(qwen.model)) == (
        "hub",
        "qwen3",
        40960,
        qwen.folder,
    )
    assert (
        found["tiny.Q4_0"].kind,
        found["tiny.Q4_0"].size_bytes,
        found["tiny.Q4_0"].architecture,
        found["tiny.Q4_0"].context_len,
    ) == ("gguf", 3000, "MistralForCausalLM", None)


def test_the_panel_labels_name_size_architecture_and_context():
    from minisgl_app.chat.reply_source import ModelEntry
    from minisgl_app.chat.view import model_choices

    entries = [
        ModelEntry(DEMO, "demo", 517_000_000, "LlamaForCausalLM", 8192, serving=True),
        ModelEntry("remote-model", "remote"),
    ]
    assert model_choices(entries) == [
        (f"● {DEMO} · 0.52 GB · LlamaForCausalLM · 8,192 tokens", DEMO),
        ("remote-model", "remote-model"),
    ]


class SwitchingSource:
    """A ReplySource whose replies stream until stopped, and whose switch is checked first."""

    label = "This machine"

    def __init__(self) -> None:
        self.model_name = "first"
        self.ready = True
        self.supports_thinking = False
        self.switched: list[str] = []

    @property
    def backends(self) -> dict:
        return {"local": self}

    def status_line(self) -> str:
        return f"**Ready** · {self.model_name}"

    async def generate(self, request, stop):
        from minisgl_engine import UserReply

        for i in range(1000):
            if stop.is_set():
                return
            yield UserReply(0, f"w{i} ", completion_tokens=i + 1)
            await asyncio.sleep(0.01)

    async def list_models(self):
        from minisgl_app.chat.reply_source import ModelEntry

        return [
            ModelEntry(name, kind, backend="local", serving=name == self.model_name)
            for name, kind in (("first", "demo"), ("second", "hub"), ("bad", "hub"))
        ]

    async def check_model(self, name: str) -> None:
        from minisgl_app.chat.reply_source import ModelError

        if name == "bad":
            raise ModelError("unsupported model architecture 'gpt2'")

    async def switch_model(self, name: str) -> None:
        self.switched.append(name)
        self.model_name = name


@pytest.mark.anyio
async def test_a_switch_stops_replies_in_flight_marked_and_a_refused_model_stops_nothing(
    tmp_path,
) -> None:
    from minisgl_app.chat.settings_form import SettingsForm
    from minisgl_app.chat.store import ConversationStore
    from minisgl_app.page.ui import ChatPage

    class Request:
        session_hash = "tab-1"

    store = ConversationStore(tmp_path / "chats.sqlite3")
    source = SwitchingSource()
    page = ChatPage(source, store)
    settings = SettingsForm(
        system_prompt="",
        temperature=0.0,
        top_p=1.0,
        max_tokens=64,
        thinking=False,
        top_k=0,
        seed=None,
        stop="",
        repetition_penalty=1.15,
    )
    await page.send("hello", settings, None, Request())
    conv_id = page.tab(Request()).conv_id
    await asyncio.sleep(0.1)
    messages = [m async for m in page.switch_model("bad", Request())]
    assert (
        "cannot be served: unsupported model architecture 'gpt2'" in messages[-1][0]
        and "first keeps serving" in messages[-1][0]
    )
    assert page.replies.is_busy(conv_id) and source.switched == []  # nothing stopped
    messages = [m async for m in page.switch_model("second", Request())]
    assert messages[-1][0] == "Now serving **second**." and source.switched == ["second"]
    while page.replies.is_busy(conv_id):
        await asyncio.sleep(0.01)
    reply = store.get(conv_id).messages[-1]
    assert (
        reply.model == "first"
        and reply.stats.stopped
        and reply.stats.stopped_by == "switch to second"
    )
    await page.send("again", settings, None, Request())
    await asyncio.sleep(0.05)
    page.replies.stop(conv_id)
    while page.replies.is_busy(conv_id):
        await asyncio.sleep(0.01)
    reply = store.get(conv_id).messages[-1]
    assert reply.model == "second" and reply.stats.stopped and reply.stats.stopped_by is None


# ---- in the browser, against the real app


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    from minisgl_engine.weights.demo import demo_model_dir

    hub = tmp_path_factory.mktemp("hf-hub")
    make_tiny_chat_model(hub, TINY, demo_model_dir())
    make_tiny_chat_model(hub, BROKEN, demo_model_dir(), drop="model.norm.weight")
    make_unsupported_model(hub, UNSUPPORTED)
    return hub


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory, hub_cache):
    """The hub the app asks: it has the cached test models (the same commit: nothing to fetch)
    and PULLED, which the cache lacks."""
    from minisgl_engine.weights.demo import demo_model_dir

    origin = tmp_path_factory.mktemp("hub-origin")
    make_tiny_chat_model(origin, PULLED, demo_model_dir())
    hub = FakeHub(origin, hub_cache)
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory, hub_cache, fake_hub):
    srv = ServerProcess(
        "--no-browser",
        "--max-kv-tokens",
        "16384",
        command="chat",
        log_path=tmp_path_factory.mktemp("models-panel-app") / "app.log",
        env={
            "MINISGL_DATA_DIR": str(tmp_path_factory.mktemp("models-panel-data")),
            "HF_HUB_CACHE": str(hub_cache),
            "HF_ENDPOINT": fake_hub.url,
            "HF_HUB_OFFLINE": "0",
        },
    )
    yield srv
    srv.stop()


def open_tab(browser, app):
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    errors: list[str] = []
    page.on("response", lambda r: r.status >= 500 and errors.append(f"{r.status} {r.url}"))
    page.goto(app.page_url)
    wait_page_loaded(page)
    return page, errors


def status(page) -> str:
    return status_text(page)


def stats_lines(page) -> list[str]:
    return [t.strip() for t in page.locator(LINE).all_inner_texts()]


def panel_message(page) -> str:
    return page.inner_text("#model-message")


def open_models(page) -> None:
    if not page.locator("#model-list").is_visible():
        page.get_by_text("Models", exact=True).first.click()
        page.locator("#model-list").wait_for(state="visible", timeout=5_000)
    assert wait_until(lambda: page.locator("#model-list label").count() > 0, 10)


def switch_to(page, name: str, expect: str, timeout: float = 120) -> str:
    """Pick ``name`` in the panel and press Switch; the panel's message once it says ``expect``."""
    open_models(page)
    page.locator("#model-list label", has_text=name).first.click()
    page.click("#switch-model-btn")
    assert wait_until(lambda: expect in panel_message(page), timeout), (
        f"the panel says {panel_message(page)!r}; status line {status(page)!r}; log: {app_log[0].output()[-1500:]}"
    )
    return panel_message(page)


app_log: list[ServerProcess] = []


def set_max_tokens(page, n: int) -> None:
    """This chat's max tokens, and greedy sampling (replies are deterministic)."""
    if not page.locator("#max-tokens input").is_visible():
        page.get_by_text("Settings", exact=True).first.click()
    for selector, value in (
        ("#max-tokens input", str(n)),
        ("#temperature input[type=number]", "0"),
    ):
        # put in again if the accordion, just opened, set the saved value over it; then left (saved)
        put_setting(page, selector, value)
    assert wait_until(
        lambda: (
            page.input_value("#max-tokens input") == str(n)
            and float(page.input_value("#temperature input[type=number]")) == 0
        ),
        5,
    )
    time.sleep(0.5)


def ask(page, text: str, timeout: float = 60) -> str:
    """Send ``text`` in a new chat and wait for its reply to finish; the reply's stats line."""
    open_new_chat(page)
    set_max_tokens(page, 12)
    send(page, text)
    assert wait_until(
        lambda: len(stats_lines(page)) == 1 and "tokens" in stats_lines(page)[-1], timeout
    ), f"no reply: {page.inner_text('#chatbot')[-300:]!r}; status {status(page)!r}"
    return stats_lines(page)[-1]


def browser_test(fn):
    """The browser modules' marks (Chromium, the demo model), on the tests that use them only."""
    for mark in BROWSER_MARKS:
        fn = mark(fn)
    return fn


@browser_test
def test_switch_to_a_local_model_and_back_while_another_tab_streams(browser, app):  # noqa: F811
    app_log[:] = [app]
    streaming, streaming_errors = open_tab(browser, app)
    switcher, switcher_errors = open_tab(browser, app)
    open_models(switcher)
    labels = switcher.locator("#model-list label").all_inner_texts()
    assert any(
        DEMO in label
        and label.startswith("●")
        and "LlamaForCausalLM" in label
        and "8,192 tokens" in label
        for label in labels
    ), labels
    assert any(
        TINY in label and "LlamaForCausalLM" in label and "2,048 tokens" in label and "MB" in label
        for label in labels
    ), labels

    # a long reply streams in one tab while the other switches
    set_max_tokens(streaming, 2000)
    send(streaming, "Write a very long story about a dragon who learns to cook. Use many chapters.")
    assert wait_until(
        lambda: (
            len(streaming.locator(REPLY).all_inner_texts()) > 0
            and len(streaming.locator(REPLY).all_inner_texts()[-1]) > 20
        ),
        60,
    )
    said = switch_to(switcher, TINY, f"Now serving {TINY}")
    assert wait_until(
        lambda: any(f"stopped (switch to {TINY})" in line for line in stats_lines(streaming)), 15
    ), stats_lines(streaming)
    assert wait_until(
        lambda: f"Ready** · {TINY}" in status(streaming) or f"Ready · {TINY}" in status(streaming),
        10,
    ), status(streaming)
    assert served_model(app.url) == TINY, said
    assert httpx.get(f"{app.url}/v1/models", timeout=5).json()["data"][0]["max_model_len"] == 2048

    # a chat now is answered by the tiny model, in the page and through the API
    line = ask(streaming, "Hello there")
    assert TINY in line and "stopped" not in line, line
    r = httpx.post(
        f"{app.url}/v1/chat/completions",
        json={"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["model"] == TINY, r.text
    assert (
        httpx.post(
            f"{app.url}/v1/chat/completions",
            json={"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        ).status_code
        == 404
    )

    # and back
    switch_to(switcher, DEMO, f"Now serving {DEMO}")
    assert served_model(app.url) == DEMO
    line = ask(streaming, "What is the capital of France?")
    assert DEMO in line and "stopped" not in line, line
    assert "Paris" in streaming.locator(REPLY).all_inner_texts()[-1]
    assert wait_until(lambda: engine_idle(app), 15)
    assert not streaming_errors and not switcher_errors, streaming_errors + switcher_errors
    assert (
        streaming.locator(".toast-body.error").count() == 0
        and switcher.locator(".toast-body.error").count() == 0
    )


@browser_test
def test_a_model_that_fails_leaves_the_old_one_serving_with_a_message(browser, app):  # noqa: F811
    app_log[:] = [app]
    page, errors = open_tab(browser, app)
    workers = sorted(p.pid for p in app.workers())
    # refused before anything stops: the same workers keep serving
    said = switch_to(page, UNSUPPORTED, "cannot be served")
    assert "unsupported model architecture 'gpt2'" in said and f"{DEMO} keeps serving" in said, said
    assert sorted(p.pid for p in app.workers()) == workers
    assert served_model(app.url) == DEMO
    # fails as it loads: the demo model is started again
    said = switch_to(page, BROKEN, "serving again", timeout=180)
    assert f"{BROKEN} could not be loaded" in said and f"{DEMO} is serving again" in said, said
    assert served_model(app.url) == DEMO
    assert wait_until(
        lambda: f"Ready** · {DEMO}" in status(page) or f"Ready · {DEMO}" in status(page), 10
    ), status(page)
    line = ask(page, "What is the capital of France?")
    assert DEMO in line, line
    assert not errors, errors
    assert app.proc.poll() is None


def pull(page, model: str, expect: str, timeout: float = 120) -> str:
    """Type ``model`` in the panel's pull box and press Pull; the pull's line once it says ``expect``."""
    open_models(page)
    page.fill("#pull-input textarea", model)
    page.click("#pull-btn")
    assert wait_until(lambda: expect in pull_line(page), timeout), (
        f"the pull says {pull_line(page)!r}; log: {app_log[0].output()[-1500:]}"
    )
    return pull_line(page)


def pull_line(page) -> str:
    return page.inner_text("#pull-message")


def in_view(page, selector: str) -> bool:
    """Whether the element lies whole within the window (its scroll containers scrolled to it)."""
    return page.evaluate(
        """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
        return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }""",
        selector,
    )


def pulls_running(app) -> list[str]:
    return [" ".join(p.cmdline()) for p in app.workers() if "pull" in p.cmdline()]


@browser_test
def test_pull_from_the_page_with_progress_cancel_and_a_failure_then_serve_it(
    browser, app, fake_hub
):  # noqa: F811
    app_log[:] = [app]
    page, errors = open_tab(browser, app)
    # an id the hub does not have: a sentence, nothing listed, the demo model serving on
    page.set_viewport_size(
        {"width": 1280, "height": 800}
    )  # a laptop: the panel's foot is below the fold
    said = pull(page, "test/not-on-the-hub", "failed")
    assert "was not found on the Hugging Face Hub" in said, said
    # ... said where the user looks: the line is scrolled into view inside the sidebar
    assert wait_until(lambda: in_view(page, "#pull-message"), 5), page.locator(
        "#pull-message"
    ).bounding_box()
    page.set_viewport_size({"width": 1280, "height": 900})
    # a name with Markdown and HTML in it shows as typed (its * and _ made emphasis, <i> a tag, [ ] a link)
    odd = "test/*star*_under_<i>tag</i>[link](x)"
    said = pull(page, odd, "is neither")
    assert (
        said.count(odd) == 2
        and "is neither an existing path nor a valid Hugging Face model id" in said
    ), said
    assert page.locator("#pull-message strong").inner_text() == odd
    assert page.locator("#pull-message :is(em, i, a)").count() == 0, page.inner_html(
        "#pull-message"
    )
    # Cancel pull is pressable only while a pull runs
    assert page.locator("#cancel-pull-btn").is_disabled(), (
        "Cancel pull is pressable with no pull under way"
    )
    # a slow download, cancelled midway: its progress showed, its process is gone, nothing listed
    fake_hub.bytes_per_s = 400_000
    said = pull(page, PULLED, "MB of")
    assert "downloading" in said and "%" in said, said
    assert wait_until(lambda: page.locator("#cancel-pull-btn").is_enabled(), 5), (
        "Cancel pull is not pressable during a pull"
    )
    page.click("#cancel-pull-btn")
    assert wait_until(lambda: "cancelled" in pull_line(page), 15), pull_line(page)
    assert wait_until(lambda: page.locator("#cancel-pull-btn").is_disabled(), 5), (
        "Cancel pull is still pressable after the pull"
    )
    assert wait_until(lambda: not pulls_running(app), 10), pulls_running(app)
    page.click("#refresh-models-btn")
    time.sleep(1)
    assert not any(PULLED in label for label in page.locator("#model-list label").all_inner_texts())
    # pulled again at full speed (huggingface_hub goes on from the cut download): listed and picked
    fake_hub.bytes_per_s = None
    said = pull(page, PULLED, "Pulled")
    assert wait_until(
        lambda: PULLED in page.locator("#model-list label:has(input:checked)").inner_text(), 10
    )
    label = page.locator("#model-list label", has_text=PULLED).inner_text()
    assert "LlamaForCausalLM" in label and "2,048 tokens" in label, label
    assert served_model(app.url) == DEMO  # a pull switches nothing
    # and it serves
    switch_to(page, PULLED, f"Now serving {PULLED}")
    line = ask(page, "Hello there")
    assert PULLED in line, line
    assert not errors, errors
