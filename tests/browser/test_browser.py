"""The chat app in a real browser: Debian's Chromium driven by Playwright, against the real app
(`minisgl-chat --no-browser`, demo model, engine workers over ZeroMQ). Screenshots are kept in
test-artifacts/ (or $MINISGL_ARTIFACTS)."""

from __future__ import annotations

import time

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    ARTIFACTS,
    BROWSER_MARKS,
    browser,
    engine_idle,
    open_new_chat,
    send,
    wait_page_loaded,
)
from server_utils import wait_until

pytestmark = BROWSER_MARKS
LONG_PROMPT = "Write a very long story about a dragon who learns to cook. Use many chapters."
# a reply's stats (and version) line is a message of its own under it, shown as a collapsed "thought"
STATS = "#chatbot [data-testid='bot'] .thought-group"
BOT = "#chatbot [data-testid='bot']:not(:has(.thought-group))"
USER = "#chatbot [data-testid='user']"


@pytest.fixture
def app(chat_app):
    """The chat app of conftest.py, which test_chat_page shares."""
    return chat_app


def open_page(browser, app):
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.goto(app.page_url)
    wait_page_loaded(page)
    return page


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def last_reply(page) -> str:
    bots = page.locator(BOT)
    return bots.nth(bots.count() - 1).inner_text() if bots.count() else ""


def stats_text(page) -> str:
    """The stats lines of the shown chat, one per finished reply."""
    return "\n".join(page.locator(STATS).all_inner_texts())


def new_greedy_chat(page, max_tokens: int = 1024) -> None:
    """A new chat whose settings make a long, deterministic reply (greedy, many tokens).

    New chat resets the settings fields when the server answers the click; a field typed into
    before that answer arrives is reset (seen in CI: a "greedy" chat replied with the default
    temperature and length). So wait for the answer (the sidebar selects no chat: the page
    draws that after New chat's answer) before typing."""
    open_new_chat(page)
    make_greedy(page, max_tokens)


def make_greedy(page, max_tokens: int = 1024) -> None:
    """This chat's settings: greedy and long (a sampled reply can end after a sentence)."""
    if not page.locator("#temperature input[type=number]").is_visible():
        page.click("#settings >> text=Settings")
    # no repetition penalty either: the page's default reshapes a greedy reply
    fields = {
        "#temperature input[type=number]": "0",
        "#max-tokens input": str(max_tokens),
        "#repetition-penalty input[type=number]": "1",
    }
    for selector, value in fields.items():
        set_field(page, selector, value)
    # the values must hold (a reset still on its way would undo them: type them again then)
    steady_since = time.monotonic()
    while time.monotonic() - steady_since < 1.0:
        for selector, value in fields.items():
            if float(page.input_value(selector) or "nan") != float(value):
                set_field(page, selector, value)
                steady_since = time.monotonic()
        time.sleep(0.1)


def set_field(page, selector: str, value: str) -> None:
    """Type into a settings field as a person does; it is saved when left (no Save button)."""
    box = page.locator(selector)
    box.click()
    box.press("Control+a")
    box.press_sequentially(value, delay=20)
    box.press("Tab")


def test_reply_streams_in_growing_pieces(browser, app):
    page = open_page(browser, app)
    new_greedy_chat(page, max_tokens=256)  # greedy: the answer is deterministic
    # a reply of 256 tokens: a few seconds on 2 cores (the demo model decodes ~100-180 tok/s),
    # several renders (the page draws ~4 a second)
    send(page, "Describe Paris, the capital of France, in three long paragraphs.")
    lengths = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lengths.append(len(last_reply(page)))
        if "tok/s" in stats_text(page):
            break
        time.sleep(0.05)
    shot(page, "01-streamed-reply")
    distinct = sorted(set(x for x in lengths if x > 0))
    assert len(distinct) >= 3, f"the reply did not grow over time: {distinct}"
    assert "Paris" in last_reply(page)
    assert "tok/s" in stats_text(page)
    page.close()


def test_stop_freezes_the_reply_and_frees_the_engine(browser, app):
    page = open_page(browser, app)
    new_greedy_chat(page)
    send(page, LONG_PROMPT)
    assert wait_until(lambda: len(last_reply(page)) > 40, 60)
    page.click("#stop-btn")
    t0 = time.monotonic()
    assert wait_until(lambda: engine_idle(app), 2.0), app.metrics()
    # the page draws a stream at most 4 times a second: the tokens made before the Stop land in
    # its last render, the one that also marks the reply stopped; after that nothing may change
    assert wait_until(lambda: "stopped" in stats_text(page), 5), stats_text(page)
    frozen = last_reply(page)
    time.sleep(1.0)
    assert last_reply(page) == frozen, "text kept growing after Stop"
    shot(page, "02-stopped")
    assert time.monotonic() - t0 < 10
    page.close()


def test_closing_the_tab_mid_reply_aborts(browser, app):
    page = open_page(browser, app)
    new_greedy_chat(page)
    send(page, LONG_PROMPT)
    assert wait_until(lambda: len(last_reply(page)) > 40, 60)
    assert app.metrics()["minisgl_running_requests"] == 1
    page.close()
    assert wait_until(lambda: engine_idle(app), 5.0), app.metrics()


def test_two_tabs_chat_at_the_same_time(browser, app):
    a, b = open_page(browser, app), open_page(browser, app)
    for page in (a, b):
        new_greedy_chat(page)
        send(page, LONG_PROMPT)
    both = wait_until(lambda: app.metrics()["minisgl_running_requests"] == 2, 30)
    assert both, "the two tabs were not generating at the same time"
    assert wait_until(lambda: len(last_reply(a)) > 20 and len(last_reply(b)) > 20, 60)
    shot(a, "03-tab-a")
    shot(b, "04-tab-b")
    a.click("#stop-btn")
    b.click("#stop-btn")
    assert wait_until(lambda: engine_idle(app), 5.0)
    a.close()
    b.close()


def test_invalid_settings_are_refused_with_a_message(browser, app):
    page = open_page(browser, app)
    if not page.locator("#max-tokens input").is_visible():
        page.click("#settings >> text=Settings")
    before = page.input_value("#max-tokens input")
    set_field(page, "#max-tokens input", "0")
    toast = page.wait_for_selector(
        "text=Settings not saved", timeout=30_000
    )  # a loaded CI machine is slow
    assert (
        "max tokens" in toast.inner_text().lower()
        or "max tokens" in page.inner_text("body").lower()
    )
    # the refused value does not stay in the box: the value in force is back
    assert wait_until(lambda: page.input_value("#max-tokens input") == before, 10), (
        page.input_value("#max-tokens input")
    )
    shot(page, "06-invalid-settings")
    # a number typed into a slider's box beyond its range: the same sentence (Gradio's own range
    # check used to raise first: a bare "Error" toast and a traceback in the log)
    before = page.input_value("#temperature input[type=number]")
    set_field(page, "#temperature input[type=number]", "5")
    assert wait_until(
        lambda: "temperature must be between 0 and 2" in page.inner_text("body"), 30
    ), page.inner_text("body")[-500:]
    assert "greater than maximum" not in page.inner_text("body")
    assert wait_until(lambda: page.input_value("#temperature input[type=number]") == before, 10), (
        page.input_value("#temperature input[type=number]")
    )
    # a fraction where a whole number goes: refused and put back, not saved rounded
    before = page.input_value("#max-tokens input")
    set_field(page, "#max-tokens input", "2.5")
    assert wait_until(lambda: "max tokens must be a whole number" in page.inner_text("body"), 30), (
        page.inner_text("body")[-500:]
    )
    assert wait_until(lambda: page.input_value("#max-tokens input") == before, 10), (
        page.input_value("#max-tokens input")
    )
    page.close()


def test_eight_tabs_of_one_browser_each_load_and_chat(browser, app):
    """A browser keeps at most six HTTP/1.1 connections to one server, shared by its tabs. Each
    open tab of the page held one for as long as it was open (Gradio's heartbeat stream, which
    tells the server a tab closed), so a seventh tab in one browser profile never loaded and the
    others' requests waited with it. A tab now holds a connection only while one of its events
    runs: eight tabs each load and get their reply."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        pages = []
        for _ in range(8):
            page = context.new_page()
            page.goto(app.page_url)
            wait_page_loaded(page)
            pages.append(page)
        for i, page in enumerate(pages):
            open_new_chat(page)
            send(page, f"Tab {i} asks: what is the capital of France?")
        for i, page in enumerate(pages):
            assert wait_until(lambda: "tok/s" in stats_text(page), 120), (
                f"tab {i} got no reply: {last_reply(page)!r}"
            )
            assert f"Tab {i} asks" in page.inner_text("#chatbot")
    finally:
        context.close()


def test_a_page_on_another_local_port_cannot_frame_the_app(browser, app, tmp_path):
    """Clickjacking: a page served from another local port frames the chat; the browser refuses
    the frame (X-Frame-Options / frame-ancestors), so nothing of the app shows in it."""
    import functools
    import http.server
    import threading

    (tmp_path / "index.html").write_text(
        f'<h1>other site</h1><iframe id="f" src="{app.page_url}" width="800" height="600"></iframe>'
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{other.server_address[1]}/index.html")
        page.wait_for_selector("#f")
        time.sleep(3)  # time enough for the app's page and its scripts, had the frame been allowed
        frame = next(f for f in page.frames if f != page.main_frame)
        assert not frame.url.startswith(app.url), frame.url  # Chromium swaps in its error page
        assert frame.locator("#msg-input").count() == 0 and frame.locator("#chatbot").count() == 0
        shot(page, "09-framed")
        page.close()
    finally:
        other.shutdown()


def test_a_conversation_longer_than_the_context_says_what_to_do(browser, app):
    page = open_page(browser, app)
    new_greedy_chat(page, max_tokens=64)  # greedy: the follow-up's answer is deterministic
    send(page, "hello " * 9000)
    # one message too long on its own: not sent, a notice says why and what to do (no reply)
    notice = lambda: " ".join(page.locator(".toast-body").all_inner_texts())  # noqa: E731
    assert wait_until(lambda: "too long for the model" in notice(), 60), notice()
    assert "shorten it" in notice() and "8,192" in notice(), notice()
    shot(page, "07-too-long")
    assert engine_idle(app)
    # the app keeps serving
    send(page, "What is the capital of France?")
    assert wait_until(lambda: "Paris" in last_reply(page), 60)
    page.close()


def test_reload_keeps_the_conversation(browser, app):
    """A reload shows the stored chat again (a restart of the app on the same data folder is
    tests/browser/test_chat_features.py's regenerate test: one restart covers both)."""
    page = open_page(browser, app)
    open_new_chat(page)
    send(page, "Remember the word pineapple.")
    assert wait_until(lambda: "tok/s" in stats_text(page), 90)
    page.reload()
    page.wait_for_selector(USER, timeout=30_000)
    assert "pineapple" in page.inner_text("#chatbot")
    assert "pineapple" in page.inner_text("#conv-list").lower()
    page.close()


def test_the_printed_link_opens_the_page_and_a_browser_without_it_gets_the_login_form(browser, app):
    """The link the app prints (and opens) logs the browser in and leaves an address without the
    key; a browser that has only the address gets a form, and the page key from the app's data
    folder opens the chat there."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    try:
        page = context.new_page()
        page.goto(app.page_url)
        wait_page_loaded(page)
        assert "token" not in page.url, page.url
        page.reload()  # the cookie keeps it logged in
        wait_page_loaded(page)
        stranger = browser.new_page()
        stranger.goto(f"{app.url}/")
        stranger.wait_for_selector("input[type=password]", timeout=30_000)
        assert stranger.locator("#msg-input").count() == 0 and "terminal" in stranger.inner_text(
            "body"
        )
        shot(stranger, "10-login")
        stranger.fill("input[type=password]", (app.data_dir / "page-key").read_text().strip())
        stranger.click("button:has-text('Open')")
        wait_page_loaded(stranger)
        stranger.close()
    finally:
        context.close()
