"""Stopping the chat app while a tab is open and a reply streams in it: SIGTERM (what `kill`,
systemd and Ctrl+C's cousin send) ends every process within seconds and writes no traceback."""

from __future__ import annotations

import time

from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    REPLY,
    browser,
    open_new_chat,
    send,
    wait_page_loaded,
)
from server_utils import wait_until

pytestmark = BROWSER_MARKS


def test_sigterm_with_a_reply_streaming_exits_in_5_s_without_a_traceback(browser, chat_app):
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    try:
        page.goto(chat_app.page_url)
        wait_page_loaded(page)
        open_new_chat(page)
        send(page, "Write a very long story about a lighthouse keeper. Use many chapters.")
        assert wait_until(lambda: len(page.locator(REPLY).last.inner_text()) > 20, 60)
        log_path = chat_app.srv.log_path
        start = time.monotonic()
        chat_app.stop()  # SIGTERM to the app's process, as `kill` sends
        took = time.monotonic() - start
    finally:
        page.close()
        chat_app.start_again()  # the other tests' app
    log = log_path.read_text(errors="replace")
    assert took < 5, f"the app took {took:.1f} s to exit after SIGTERM"
    # the heartbeat stream of each open tab used to be cancelled by uvicorn after its 2 s grace
    assert "Traceback" not in log and "graceful shutdown exceeded" not in log, log[-3000:]
