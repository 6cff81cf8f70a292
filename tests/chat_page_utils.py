"""What the browser test modules share (test_browser, test_chat_page, test_chat_features and the
soak suite's chat tests): Debian's Chromium as one module-scoped Playwright browser, the marks
that skip a module without it or the demo model, the page's selectors, and the few actions and
checks every module makes the same way."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from server_utils import wait_until

from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason="Debian's chromium is not installed (apt-get install chromium)",
    ),
    pytest.mark.skipif(
        not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
    ),
]
ARTIFACTS = Path(
    os.environ.get("MINISGL_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts")
)

# A message's own text: a reply's stats line and the versions line under a message are messages
# of their own, shown as a collapsed `.thought-group` (so is a reasoning model's thinking).
USER = "#chatbot [data-testid='user']:not(:has(.thought-group))"
REPLY = "#chatbot [data-testid='bot']:not(:has(.thought-group))"
LINE = "#chatbot .thought-group"


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module (each test opens its own context or page)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def engine_idle(app) -> bool:
    """Nothing running and no KV page held (the prefix cache may keep pages: they are not held)."""
    m = app.metrics()
    return m.get("minisgl_running_requests") == 0 and m.get("minisgl_kv_pages_used") == 0


def wait_page_loaded(page, status: str = "running", timeout: float = 60) -> None:
    """Wait until the page's load is answered and drawn (the app marks the page then) and the status
    line says ``status``. Not the status line alone: the once-a-second tick draws it too, sometimes
    before the load's answer, whose settings then overwrite what a test typed first."""
    page.wait_for_selector("body[data-chat-loaded='1']", state="attached", timeout=timeout * 1000)
    assert wait_until(lambda: status in status_text(page), timeout), status_text(page)


def open_new_chat(page, timeout: float = 30) -> None:
    """Press New chat and wait until the page shows it: no chat selected in the list, no message
    in the window. (The click's answer comes back a moment later; a setting typed or a count taken
    before then would belong to the chat shown before.)"""
    page.click("#new-chat-btn")
    assert wait_until(
        lambda: (
            page.locator("#conv-list input:checked").count() == 0
            and page.locator(USER).count() == 0
        ),
        timeout,
    ), f"New chat not shown {timeout} s after the click: {page.inner_text('#chatbot')[:200]!r}"


def open_chat_list(page) -> None:
    """On a phone the chat list opens from the bar above the chat (☰ Chats); elsewhere it is shown."""
    toggle = page.locator("#chats-toggle")
    if toggle.is_visible() and toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
        page.locator("#conv-list").wait_for(state="visible", timeout=5_000)


def pick_import_file(page, path) -> None:
    """Manage → Import chat, and ``path`` given to its file chooser."""
    if not page.locator("#import-btn").is_visible():
        page.click("text=Manage")
        page.wait_for_selector("#import-btn", state="visible")
    with page.expect_file_chooser() as chooser:
        page.click("#import-btn")
    chooser.value.set_files(str(path))


def attach_file(page, path) -> None:
    """Attach a file with the page's Attach button, as a person does (the chooser)."""
    with page.expect_file_chooser() as chooser:
        page.click("#attach-btn")
    chooser.value.set_files(str(path))


def status_text(page) -> str:
    """The status line as shown (its Markdown only: see ``attached_line``; the once-a-second tick
    that draws it has a hidden tracker too)."""
    return page.inner_text("#status-line [data-testid=markdown]")


def attached_line(page) -> str:
    """The line naming the files attached, as shown: its Markdown only, not Gradio's status
    tracker beside it, whose "processing | 0.2s" stays in the text while hidden (opacity 0)."""
    return page.inner_text("#attached [data-testid=markdown]")


def stop_what_runs(page) -> None:
    """Stop pressed to end a reply that may have ended already: Stop is disabled then (page.js),
    and a click (which would wait for it to be enabled) is a no-op instead."""
    page.evaluate("() => document.querySelector('#stop-btn')?.click()")


def send(page, text: str) -> None:
    """Type a message and press Enter, as a person does."""
    page.fill("#msg-input textarea", text)
    page.press("#msg-input textarea", "Enter")


# Gradio's own progress text ("queue: 1/1 | 0.1s", "processing | 2.3s", a bare "0.4s"): any in
# the status line, and any progress box drawn anywhere (there are none: every event hides its own)
WATCH_PROGRESS_JS = """() => {
  window.progressSeen = [];
  const look = () => {
    const line = document.querySelector('#status-line');
    if (line && /queue:|processing|\\b\\d+\\.\\d+s\\b/.test(line.innerText)) window.progressSeen.push('status line: ' + line.innerText);
    for (const t of document.querySelectorAll('[data-testid=status-tracker]')) {
      const text = t.innerText.trim();
      if (text && t.getClientRects().length) window.progressSeen.push((t.closest('[id]') || {}).id + ': ' + text);
    }
  };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def watch_progress(page) -> None:
    """Record, from now on, any Gradio progress text in the page (``progress_seen``)."""
    page.evaluate(WATCH_PROGRESS_JS)


def progress_seen(page) -> list[str]:
    return page.evaluate("window.progressSeen || []")


def empty_button_boxes(page) -> int:
    """Button boxes drawn in the chat with no button shown in them (each looks like a stray dot)."""
    return page.evaluate("""() => [...document.querySelectorAll('#chatbot .message-buttons, #chatbot .icon-button-wrapper')]
        .filter(box => box.getClientRects().length && ![...box.querySelectorAll('button')].some(b => b.getClientRects().length))
        .length""")


def below(page, upper: str, lower: str) -> bool:
    """The element ``lower`` starts below where ``upper`` ends (both shown)."""
    a, b = page.locator(upper).first.bounding_box(), page.locator(lower).first.bounding_box()
    return a is not None and b is not None and b["y"] >= a["y"] + a["height"] - 0.5


def whole_on_screen(page, selector: str) -> bool:
    """The element is inside the viewport's width and its label is not cut (no overflow)."""
    box, width = page.locator(selector).bounding_box(), page.viewport_size["width"]
    fits = page.locator(selector).evaluate("e => e.scrollWidth <= e.clientWidth")
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width and fits


def put_setting(page, selector: str, value: str, leave: str = "Tab") -> None:
    """Put ``value`` into a settings box at once (Playwright's fill: one input event, as a paste
    does) and leave it, which saves it. The first time the Settings accordion opens, Gradio mounts
    its boxes and, 30-60 ms later, sets their values once more from the page's state: a value put
    in before then is overwritten by the saved one, and leaving the box saves nothing (measured in
    Chromium: 3 of 15 values put in as the box appeared were overwritten, none of 15 put in 30 ms
    later, none of 8 put in 60 ms later on a loaded machine). No person is that fast; a test is,
    so the value is put in again if the box did not keep it, and only then is the box left."""
    box = page.locator(selector)
    for _ in range(3):
        box.fill(value)
        time.sleep(0.2)  # past the accordion's late setting of its boxes' values
        if box.input_value() == value:
            break
    box.press(leave)


def miss_checks(page) -> None:
    """From now on the page's once-a-second check (its tick) never reaches the server: the page
    keeps what it last drew, as a tab does between two checks (or while it is busy elsewhere),
    until the user acts in it. The first tick is answered with an event the server never runs,
    and Gradio sends no other tick while one is pending. (Playwright's handler runs during the
    test's page calls: wait with them, not with time.sleep.)"""
    import json

    tick = page.evaluate(
        "() => window.gradio_config.dependencies.find(d => d.targets.some(t => t[1] === 'tick')).id"
    )

    def hold(route) -> None:
        if (route.request.post_data_json or {}).get("fn_index") == tick:
            route.fulfill(
                status=200,
                content_type="application/json",
                body=json.dumps({"event_id": "never-run"}),
            )
        else:
            route.continue_()

    page.route("**/gradio_api/queue/join*", hold)


# ---- tools (MCP) in the page

MCP_TEST_SERVER = Path(__file__).parent / "mcp_test_server.py"
TOOL_WAIT_S = 180  # a reply up to its tool call, on a loaded 2-core machine


def chat_lines(page) -> str:
    """The chat's text once it has a line under a message (a call's, a reply's stats); else ""."""
    return page.inner_text("#chatbot") if page.locator(LINE).count() else ""


def add_test_tool_server(page, pid_file: Path, name: str = "test") -> None:
    """Add tests/mcp_test_server.py (stdio) in the Tools panel; wait until its tools are listed."""
    import shlex
    import sys

    page.click('#tools >> text="Tools"')
    page.click("#add-tool-server >> text=Add an MCP server")
    page.fill("#tool-server-name textarea", name)
    page.fill("#tool-command textarea", sys.executable)
    page.fill("#tool-args textarea", shlex.join([str(MCP_TEST_SERVER), str(pid_file)]))
    page.click("#add-tool-server-btn")
    assert wait_until(lambda: "hang" in page.inner_text("#tool-servers"), 60)


def remove_tool_server(page, name: str = "test") -> None:
    """Remove (by name) in the Tools panel: the server stops and is forgotten."""
    if not page.locator("#tool-server-name textarea").is_visible():
        page.click('#tools >> text="Tools"')
        page.click("#add-tool-server >> text=Add an MCP server")
    page.fill("#tool-server-name textarea", name)
    page.click("#remove-tool-server-btn")
    assert wait_until(lambda: "hang" not in page.inner_text("#tool-servers"), 30)


def pick_tool(page, tool: str) -> None:
    """The chat may call ``tool``, and must call it first in each reply."""
    page.click(f"#chat-tools label:has-text('{tool}')")
    choice = page.locator(f"#tool-choice label:has-text('{tool}')")
    choice.wait_for(state="visible", timeout=10_000)
    choice.click()
    assert wait_until(lambda: choice.locator("input").is_checked(), 10)


def ask_and_wait_for_approval(page, text: str, tool: str) -> None:
    """Send ``text``; the reply's call of ``tool`` shows and waits for Allow or Deny."""
    send(page, text)
    page.wait_for_selector("#tool-approval", state="visible", timeout=TOOL_WAIT_S * 1000)
    assert tool in page.inner_text("#tool-approval")
    assert f"{tool} · asks to run" in chat_lines(page)
