"""What a new user's tour of the chat page found (issue 45: the demo model on a CPU, at 1280x800
and 390x844, in light and dark mode), each as a person meets it in Debian's Chromium
(Playwright), against the app that the browser tests share (conftest.py's ``chat_app``)."""

from __future__ import annotations

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    browser,
    engine_idle,
    wait_page_loaded,
)
from server_utils import wait_until

pytestmark = BROWSER_MARKS

BOX = "#msg-input textarea"


@pytest.fixture
def app(chat_app):
    return chat_app


@pytest.fixture
def open_page(browser, app):
    """``open_page(width, height, dark=False, chat_id=None)``: a tab of its own (a fresh browser
    context, so a session of its own) on the app, the system's colours dark or light; closed after
    the test, the engine left idle."""
    contexts = []

    def make(width: int = 1280, height: int = 800, dark: bool = False, chat_id: int | None = None):
        ctx = browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme="dark" if dark else "light",
        )
        contexts.append(ctx)
        page = ctx.new_page()
        page.goto(app.page_url + (f"&chat={chat_id}" if chat_id is not None else ""))
        wait_page_loaded(page)
        return page

    yield make
    for ctx in contexts:
        ctx.close()
    wait_until(lambda: engine_idle(app), 15)


def page_height(page) -> int:
    return page.evaluate("document.documentElement.scrollHeight")


# ---- 3. a long message stays in the window


def test_a_long_message_scrolls_inside_the_message_box_and_the_page_does_not_scroll(open_page):
    """The message box grew with a 1,000-character message to 200 px from y = 660 at 1280x800:
    past the window's bottom, and the page scrolled. It grows into the chat above it instead,
    stops at a height of its own and scrolls inside itself."""
    page = open_page(1280, 800)
    box = page.locator(BOX)
    page.fill(BOX, "word " * 200)
    assert wait_until(lambda: box.bounding_box()["height"] > 100, 5), box.bounding_box()
    assert wait_until(lambda: page_height(page) <= 800, 5), (page_height(page), box.bounding_box())
    where = box.bounding_box()
    assert where["y"] + where["height"] <= 800, where
    assert box.evaluate("t => t.scrollHeight > t.clientHeight"), "the box shows all of its text"
