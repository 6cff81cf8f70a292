"""What a new user's tour of the chat page found (issue 45: the demo model on a CPU, at 1280x800
and 390x844, in light and dark mode), each as a person meets it in Debian's Chromium
(Playwright), against the app that the browser tests share (conftest.py's ``chat_app``)."""

from __future__ import annotations

import json
import re
import time

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    LINE,
    REPLY,
    USER,
    attach_file,
    attached_line,
    browser,
    engine_idle,
    open_chat_list,
    open_new_chat,
    pick_import_file,
    wait_page_loaded,
)
from server_utils import wait_until

from minisgl_app.chat.store import ConversationStore
from minisgl_app.chat.store.import_file import EXPORT_FORMAT

pytestmark = BROWSER_MARKS

BOX = "#msg-input textarea"
COPY = "#chatbot .message-buttons-left button[aria-label='Copy message']"


@pytest.fixture
def app(chat_app):
    return chat_app


@pytest.fixture
def open_page(browser, app):
    """``open_page(width, height, dark=False, chat_id=None, phone=False)``: a tab of its own (a
    fresh browser context, so a session of its own) on the app, the system's colours dark or
    light, a phone's touch screen or not; closed after the test, the engine left idle."""
    contexts = []

    def make(
        width: int = 1280,
        height: int = 800,
        dark: bool = False,
        chat_id: int | None = None,
        phone: bool = False,
    ):
        ctx = browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme="dark" if dark else "light",
            is_mobile=phone,
            has_touch=phone,
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


def meter_tokens(page) -> int | None:
    """The tokens the meter under the box counts ("1,234 / 8,192 tokens"), or None."""
    found = re.match(r"⚠?\s*([\d,]+) / [\d,]+ tokens", page.inner_text("#context-meter").strip())
    return int(found.group(1).replace(",", "")) if found else None


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


def test_on_a_phone_a_long_message_scrolls_inside_the_box_and_send_stays_on_the_screen(
    open_page, app
):
    """On a phone (390x844, a touch screen) a 1,300-character message grew the box to 200 px
    below the chat: Send and Stop went to y = 879, off the screen, and the page scrolled (979 px
    tall). As on a wide screen, the box grows into the chat and then scrolls inside itself;
    with the versions bar shown too."""
    chat_id = stored_long_chat(app, "Thumbed Tuco", turns=2)
    page = open_page(390, 844, chat_id=chat_id, phone=True)
    pick_message(page, "Thumbed Tuco question 1")
    page.evaluate("scrollTo(0, 0)")
    box = page.locator(BOX)
    page.fill(BOX, "Long text line with many words for the layout test. " * 25)
    assert wait_until(lambda: box.bounding_box()["height"] > 100, 5), box.bounding_box()
    assert wait_until(lambda: page_height(page) <= 844, 5), (page_height(page), box.bounding_box())
    for part in (BOX, "#send-btn", "#stop-btn"):
        where = page.locator(part).bounding_box()
        assert where["y"] >= 0 and where["y"] + where["height"] <= 844, (part, where)
    assert box.evaluate("t => t.scrollHeight > t.clientHeight"), "the box shows all of its text"


def stored_long_chat(app, title: str, turns: int, two_versions_at: int | None = None) -> int:
    """A chat of ``turns`` questions, each answered, written to the app's database. The question
    of turn ``two_versions_at`` (None: none) has two versions, as an edit leaves it: the first
    followed by the turns after it, the second (shown) by its answer only."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title=title)
        parent = None
        for turn in range(turns):
            if turn == two_versions_at:
                store.add_message(conv.id, parent, "user", f"{title} question {turn}, version 1.")
                answer_turns(store, conv.id, title, turn, turns)
                store.add_message(conv.id, parent, "user", f"{title} question {turn}, version 2.")
                answer_turns(store, conv.id, title, turn, turn + 1)
                break
            store.append(conv.id, "user", f"{title} question {turn}.")
            parent = store.append(conv.id, "assistant", answer(title, turn)).id
        return conv.id


def answer(title: str, turn: int) -> str:
    return f"{title} answer {turn}. " + "Some words of the answer. " * 12


def answer_turns(store: ConversationStore, conv_id: int, title: str, first: int, end: int) -> None:
    """The answer of turn ``first`` and the turns after it up to ``end``, below the message
    shown last."""
    store.append(conv_id, "assistant", answer(title, first))
    for turn in range(first + 1, end):
        store.append(conv_id, "user", f"{title} question {turn}.")
        store.append(conv_id, "assistant", answer(title, turn))


def pick_message(page, text: str) -> None:
    """Click the message that says ``text``: the versions bar acts on it."""
    message = page.locator(USER, has_text=text).first
    message.scroll_into_view_if_needed()
    message.click()
    page.locator("#versions").wait_for(state="visible", timeout=10_000)


# ---- 4. a disabled button looks disabled in dark mode


DRAWN_COLOURS_JS = """(b) => {
  const style = getComputedStyle(b), page = getComputedStyle(document.body);
  return [style.backgroundColor, style.color, style.opacity, page.backgroundColor];
}"""


def rgba(css: str) -> tuple[float, float, float, float]:
    """A computed CSS colour, rgb() or rgba(), as (r, g, b, alpha)."""
    parts = [float(x) for x in css[css.index("(") + 1 : -1].replace("/", ",").split(",")]
    return (*parts[:3], parts[3] if len(parts) > 3 else 1.0)


def drawn(page, selector: str) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """A button's fill and text as drawn over the page (its alpha and opacity blended into the
    page's background), and that background."""
    fill, text, opacity, ground = page.locator(selector).evaluate(DRAWN_COLOURS_JS)
    base = rgba(ground)[:3]

    def over(css: str) -> tuple[float, ...]:
        *rgb, alpha = rgba(css)
        a = alpha * float(opacity)
        return tuple(a * c + (1 - a) * g for c, g in zip(rgb, base, strict=True))

    return over(fill), over(text), base


def distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_in_dark_mode_a_disabled_button_looks_disabled(open_page, app):
    """In dark mode a disabled › (no next version) was filled indigo and a disabled Send blue,
    while the ‹ that works was grey: the buttons that do nothing looked like the ones to press.
    A disabled button is drawn with no colour of its own, standing out from the page less than a
    button that works, its text fainter."""
    chat_id = stored_long_chat(app, "Dusky Serow", turns=2, two_versions_at=0)
    page = open_page(1280, 800, dark=True, chat_id=chat_id)
    assert "dark" in page.evaluate("document.body.className"), "the page is not drawn dark"
    pick_message(page, "version 2")
    assert page.locator("#next-version-btn").is_disabled()
    assert page.locator("#prev-version-btn").is_enabled()
    assert page.locator("#send-btn").is_disabled()  # the box is empty
    usable_fill, usable_text, ground = drawn(page, "#prev-version-btn")
    for selector in ("#next-version-btn", "#send-btn"):
        fill, text, _ = drawn(page, selector)
        assert max(fill) - min(fill) < 30, f"{selector} disabled is filled with a colour: {fill}"
        assert distance(fill, ground) < distance(usable_fill, ground), (selector, fill, usable_fill)
        assert distance(text, ground) < distance(usable_text, ground), (selector, text, usable_text)


# ---- 12. toasts hide no message and do not pile up


def refuse_max_tokens(page, values: tuple[str, ...]) -> None:
    """Type each value into Settings' max tokens and press Enter: each is refused in a toast."""
    if not page.locator("#max-tokens input").is_visible():
        open_chat_list(page)  # on a phone Settings is under ☰ Chats
        page.get_by_text("Settings", exact=True).first.click()
    box = page.locator("#max-tokens input")
    box.wait_for(state="visible", timeout=5_000)
    for value in values:
        box.scroll_into_view_if_needed()
        box.fill(value)
        box.press("Enter")
        page.locator(".toast-body", has_text=f"got {value}").wait_for(timeout=10_000)


def overlap(a: dict, b: dict) -> bool:
    """Whether two bounding boxes share any area."""
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_toasts_hide_no_message_and_the_latest_replaces_the_ones_before(open_page, app):
    """Toasts opened over the chat's top right, on the messages, and three refusals piled into one
    "Warning (3)" box listing all three. They open over the sidebar, clear of the chat and the
    message box, and show the latest refusal only."""
    chat_id = stored_long_chat(app, "Toasted Oribi", turns=3)
    page = open_page(1280, 800, chat_id=chat_id)
    refuse_max_tokens(page, ("0", "-5", "-7"))
    toast = page.locator(".toast-body")
    assert toast.count() == 1, toast.all_inner_texts()
    shown = toast.inner_text()
    assert "got -7" in shown and "got -5" not in shown and "got 0" not in shown, shown
    assert "(3)" not in shown, shown
    where = toast.bounding_box()
    for part in ("#chatbot", "#composer"):
        assert not overlap(where, page.locator(part).bounding_box()), (part, where)
    assert where["y"] >= 0 and where["y"] + where["height"] <= 800, where


def test_a_toast_of_another_kind_replaces_the_one_shown(open_page, app, tmp_path):
    """A warning and then a note of another kind showed as two toasts stacked (the walkthrough:
    "Settings not saved" over "already attached"). The latest shows, alone."""
    chat_id = stored_long_chat(app, "Toasted Dibatag", turns=1)
    page = open_page(1280, 800, chat_id=chat_id)
    notes = tmp_path / "dibatag-notes.txt"
    notes.write_text("Dibatag notes\n", encoding="utf-8")
    attach_file(page, notes)
    assert wait_until(lambda: notes.name in attached_line(page), 30)
    refuse_max_tokens(page, ("0",))
    attach_file(page, notes)  # again: a note that it goes into the message once
    toast = page.locator(".toast-body:visible")
    assert wait_until(lambda: "already attached" in " ".join(toast.all_inner_texts()), 15)
    assert toast.count() == 1, toast.all_inner_texts()


def test_a_settings_toast_does_not_cover_the_box_it_is_about(open_page, app):
    """Max tokens 0 and Enter at 1280x800: the toast that refused it (y 601-784, over the
    sidebar's bottom) covered the Max tokens box (y 699-738), the value the page put back
    included. A toast opens where it does not cover the settings box last used in the sidebar;
    on a phone too (toasts open at its top)."""
    chat_id = stored_long_chat(app, "Covered Cusimanse", turns=1)
    for width, height, phone in ((1280, 800, False), (390, 844, True)):
        page = open_page(width, height, chat_id=chat_id, phone=phone)
        if phone:
            page.mouse.wheel(0, 80)  # as a person reaches the box
        refuse_max_tokens(page, ("0",))
        field = page.locator("#max-tokens input").bounding_box()
        toast = page.locator(".toast-body").bounding_box()
        assert not overlap(toast, field), (width, toast, field)
        assert toast["y"] >= 0 and toast["y"] + toast["height"] <= height, (width, toast)
        if not phone:
            for part in ("#chatbot", "#composer"):
                assert not overlap(toast, page.locator(part).bounding_box()), part


# ---- 11. ‹ › keep the message whose version changed in view


CHAT_SCROLL_JS = "document.querySelector('#chatbot .bubble-wrap').scrollTop"


def wait_chat_still(page, timeout: float = 10) -> None:
    """Wait until the chat's scroll position stays where it is from one look to the next."""
    last: list[float | None] = [None]

    def still() -> bool:
        now = page.evaluate(CHAT_SCROLL_JS)
        same, last[0] = now == last[0], now
        return same

    assert wait_until(still, timeout, interval=0.5), "the chat kept scrolling"


def in_chat_view(page, locator) -> bool:
    """The element is shown whole inside the chat's visible area."""
    box, chat = locator.bounding_box(), page.locator("#chatbot").bounding_box()
    return (
        box is not None
        and chat["y"] <= box["y"]
        and box["y"] + box["height"] <= chat["y"] + chat["height"]
    )


def test_switching_a_messages_version_keeps_that_message_in_view(open_page, app):
    """‹ on a message whose earlier version is followed by more turns drew the chat anew and
    scrolled it to its new end: the message whose version changed went off the screen (the chat
    had been at its end, and Gradio follows a chat's end). It stays where it was."""
    chat_id = stored_long_chat(app, "Scrolled Saola", turns=12, two_versions_at=6)
    page = open_page(1280, 800, chat_id=chat_id)
    pick_message(page, "question 6, version 2")
    page.click("#prev-version-btn")
    page.locator(USER, has_text="question 11.").wait_for(state="attached", timeout=10_000)
    assert "version 1 of 2" in page.inner_text("#versions-label")
    wait_chat_still(page)
    message = page.locator(USER, has_text="question 6, version 1").first
    assert in_chat_view(page, message), (message.bounding_box(), page.evaluate(CHAT_SCROLL_JS))


def test_the_next_version_of_a_reply_whose_branch_is_longer_keeps_that_reply_in_view(
    open_page, app
):
    """› on the first reply of a chat that scrolls (a long first question), from a version
    stopped before its first word (only its line under it shows) and nothing after it, to one
    followed by many turns: the chat grew by those turns and jumped to its new end, the reply
    7,000 px above the chat's top. It stays where it was."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Longer Tenrec")
        question = store.append(conv.id, "user", "Tenrec question. " + "A long question. " * 400)
        short = store.add_message(conv.id, question.id, "assistant", "")  # stopped at once
        store.add_message(conv.id, question.id, "assistant", answer("Tenrec", 0))
        for turn in range(1, 12):
            store.append(conv.id, "user", f"Tenrec question {turn}.")
            store.append(conv.id, "assistant", answer("Tenrec", turn))
        store.select_message(conv.id, short.id)  # the version with nothing after it is shown
    page = open_page(1280, 800, chat_id=conv.id)
    line = page.locator(LINE, has_text="version 1/2").first  # all that an empty reply shows
    line.wait_for(timeout=10_000)
    wait_chat_still(page)
    line.click()
    page.locator("#versions").wait_for(state="visible", timeout=10_000)
    assert "Reply 1" in page.inner_text("#versions-label")
    assert page.evaluate(CHAT_SCROLL_JS) > 1000, "the chat does not scroll"
    page.click("#next-version-btn")
    page.locator(USER, has_text="Tenrec question 11.").wait_for(state="attached", timeout=10_000)
    assert "version 2 of 2" in page.inner_text("#versions-label")
    wait_chat_still(page)
    time.sleep(1)  # Gradio follows a chat's end 300 ms after it is drawn, and again as it loads
    wait_chat_still(page)
    message = page.locator(REPLY, has_text="Tenrec answer 0.").first
    assert in_chat_view(page, message), (message.bounding_box(), page.evaluate(CHAT_SCROLL_JS))


# ---- 10. ✎ brings its edit box into view


def test_editing_a_long_first_message_brings_its_edit_box_into_view(open_page, app):
    """A long first message scrolled up until only its ✎ showed at the chat's top: ✎ opened the
    edit box where the message was, above the chat's visible part, under the status line. The
    edit box is brought into view, its top first."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Edited Gerenuk")
        store.append(
            conv.id, "user", "Gerenuk question. " + "A long question, line after line. " * 60
        )
        for turn in range(8):
            store.append(conv.id, "assistant", answer("Gerenuk", turn))
            store.append(conv.id, "user", f"Gerenuk question {turn + 1}.")
        store.append(conv.id, "assistant", answer("Gerenuk", 9))
    page = open_page(1280, 800, chat_id=conv.id)
    first = page.locator(USER).first
    edit = page.locator("#chatbot .message-buttons-right button[aria-label='Edit']").first
    page.locator(REPLY).last.wait_for(timeout=10_000)
    wait_chat_still(page)
    # the chat scrolled so that the first message's ✎ is at its top, the message above
    page.locator("#chatbot .bubble-wrap").evaluate(
        """(chat, message) => { chat.scrollTop += message.getBoundingClientRect().bottom - chat.getBoundingClientRect().top; }""",
        first.element_handle(),
    )
    assert in_chat_view(page, edit), edit.bounding_box()
    assert not in_chat_view(page, first)
    edit.click()
    editor = page.locator("#chatbot textarea.edit-textarea")
    editor.wait_for(timeout=10_000)
    wait_chat_still(page)
    top, chat = editor.bounding_box()["y"], page.locator("#chatbot").bounding_box()
    assert chat["y"] <= top <= chat["y"] + chat["height"] - 50, (top, chat)


# ---- 5. messages by keyboard


FOCUSED_JS = """() => { const e = document.activeElement;
  return e ? [e.id || e.getAttribute('aria-label') || e.getAttribute('data-testid') || e.tagName, e.closest('#delete-message-btn') !== null] : null; }"""


def test_messages_take_the_focus_in_order_and_their_actions_work_from_the_keyboard(open_page, app):
    """Messages took no focus: Delete message and ‹ › reached only a message picked with the
    mouse. Each message takes the focus with Tab (its Copy and Edit follow it with →), ringed (dark
    mode here); Enter picks it, and Tab goes on to the versions bar: ‹ (the message is its second
    version), then Delete message, which asks first."""
    chat_id = stored_long_chat(app, "Keyed Numbat", turns=2, two_versions_at=0)
    page = open_page(1280, 800, dark=True, chat_id=chat_id)
    first = page.locator(USER).first
    copy = page.locator("#chatbot button[aria-label='Copy message']").first
    copy.focus()
    page.keyboard.press("Shift+Tab")
    assert first.evaluate("m => m === document.activeElement"), page.evaluate(FOCUSED_JS)
    ring = first.evaluate(
        "m => [getComputedStyle(m).outlineStyle, getComputedStyle(m).outlineWidth]"
    )
    assert ring[0] != "none" and float(ring[1].removesuffix("px")) >= 2, ring
    page.keyboard.press("Enter")
    page.locator("#versions").wait_for(state="visible", timeout=10_000)
    assert "Your message 1" in page.inner_text("#versions-label")
    visited = []
    for _ in range(40):
        if page.evaluate(FOCUSED_JS)[1]:
            break
        page.keyboard.press("Tab")
        visited.append(page.evaluate(FOCUSED_JS)[0])
    assert page.evaluate(FOCUSED_JS)[1], f"Tab never reached Delete message: {visited}"
    assert "prev-version-btn" in visited, visited
    asked = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.keyboard.press("Enter")
    assert wait_until(lambda: asked, 5), "Enter on Delete message asked nothing"
    assert "Delete this message" in asked[0]


# ---- 14. a new chat's draft, and files attached, across a reload


def test_a_new_chats_draft_and_files_attached_come_back_after_a_reload(open_page, app, tmp_path):
    """The text typed in a new chat was lost on reload (the address became `/`, and the reload
    opened the newest saved chat); files attached went without a word, and then with a note that
    the reload had not kept them (they were the closed tab's). The reload shows the new chat with
    its text and its files still attached; a stored chat's files come back too."""
    stored_long_chat(app, "Reloaded Fossa", turns=1)  # a saved chat the reload could open instead
    page = open_page(1280, 800)
    open_new_chat(page)
    page.locator(BOX).press_sequentially("Fossa draft of a new chat")
    notes = tmp_path / "fossa-notes.txt"
    notes.write_text("Fossa notes\n", encoding="utf-8")
    assert wait_until(lambda: meter_tokens(page) is not None, 10), page.inner_text("#context-meter")
    time.sleep(1.5)  # the meter of the text typed has come back
    typed = meter_tokens(page)
    attach_file(page, notes)
    assert wait_until(lambda: notes.name in attached_line(page), 30)
    # the meter counts the file at once (it waited for the next key typed)
    assert wait_until(lambda: meter_tokens(page) > typed, 5), (typed, meter_tokens(page))
    page.reload()
    wait_page_loaded(page)
    assert wait_until(lambda: page.input_value(BOX) == "Fossa draft of a new chat", 10), (
        page.input_value(BOX),
        page.locator(USER).all_inner_texts()[:2],
    )
    assert page.locator(USER).count() == 0 and page.locator("#conv-list input:checked").count() == 0
    assert wait_until(lambda: notes.name in attached_line(page), 10), (
        attached_line(page),
        page.locator("#dropped-files-note").all_inner_texts(),
    )
    chat_id = stored_long_chat(app, "Attached Fossa", turns=1)
    page.goto(app.page_url + f"&chat={chat_id}")
    wait_page_loaded(page)
    # they are the new chat's: the stored chat's line stays empty once the load's note is drawn
    assert not wait_until(lambda: attached_line(page).strip(), 2), attached_line(page)
    attach_file(page, notes)
    assert wait_until(lambda: notes.name in attached_line(page), 30)
    page.reload()
    wait_page_loaded(page)
    assert wait_until(lambda: notes.name in attached_line(page), 10)
    assert not page.locator("#dropped-files-note").count()


# ---- 15. tables, math, the phone's layout, an imported chat's date

TABLE_AND_MATH = (
    "| Name | Count |\n|:-----|------:|\n| Okapi | 1 |\n| Bilby | 22 |\n\n"
    "Inline math $x^2$, and on its own line $$\\frac{1}{2}$$"
)


def test_a_reply_aligns_its_table_columns_and_renders_inline_math(open_page, app):
    """A right-aligned column (`---:`) was drawn left-aligned, and `$x^2$` stayed as typed (only
    `$$ … $$` was math)."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Aligned Dikdik")
        store.append(conv.id, "user", "Dikdik: a table and some math, please.")
        store.append(conv.id, "assistant", TABLE_AND_MATH)
    page = open_page(1280, 800, chat_id=conv.id)
    reply = page.locator(REPLY).first
    reply.locator("table").wait_for(timeout=10_000)
    aligns = reply.locator("td").evaluate_all(
        "cells => cells.map((c) => getComputedStyle(c).textAlign)"
    )
    assert aligns == ["left", "right", "left", "right"], aligns
    assert reply.locator(".katex").count() == 2, reply.inner_html()[:500]
    assert "$x^2$" not in reply.inner_text(), reply.inner_text()


def test_prices_stay_prose_while_dollar_math_still_renders(open_page, app):
    """With `$ … $` as math, "It costs $5 and $10." showed "It costs" and a typeset "5 and "
    (the text between two prices). A `$` opens math only before a non-space and closes it only
    after a non-space and before no digit (Pandoc's rule); `\\$` is a dollar."""
    prices, math = "It costs $5 and $10.", "Square it: $x^2$. Escaped: \\$3 and \\$4."
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Priced Genet")
        store.append(conv.id, "user", "Genet: how much?")
        store.append(conv.id, "assistant", prices)
        store.append(conv.id, "user", "Genet: and some math?")
        store.append(conv.id, "assistant", math)
    page = open_page(1280, 800, chat_id=conv.id)
    replies = page.locator(REPLY)
    assert wait_until(lambda: replies.count() == 2, 10), page.inner_text("#chatbot")[:300]
    with_math = replies.nth(1)
    with_math.locator(".katex").first.wait_for(timeout=10_000)
    priced = replies.nth(0)
    assert priced.locator(".katex, math").count() == 0, priced.inner_html()[:500]
    assert priced.inner_text().strip() == prices, priced.inner_text()
    assert with_math.locator(".katex").count() == 1, with_math.inner_html()[:500]
    shown = with_math.inner_text()
    assert "Escaped: $3 and $4." in shown and "$x^2$" not in shown, shown
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("navigator.clipboard.writeText('')")
    with_math.hover()
    page.locator(COPY).filter(visible=True).last.click()  # the last reply's (its line has none)
    assert wait_until(lambda: page.evaluate("navigator.clipboard.readText()"), 5), "none copied"
    assert page.evaluate("navigator.clipboard.readText()") == math  # as typed, without marks


A_YEAR_AGO = time.time() - 365 * 86400


def test_an_imported_chat_keeps_its_own_date_and_place_in_the_list(open_page, app, tmp_path):
    """An imported chat was dated at the import: a chat last used a year ago went to the top of
    the list, with today's time. It keeps the date its file gives (our export's updated_at)."""
    stored_long_chat(app, "Recent Zorilla", turns=1)  # a chat used after the imported one
    exported = {
        "format": EXPORT_FORMAT,
        "title": "Old Zorilla",
        "created_at": A_YEAR_AGO,
        "updated_at": A_YEAR_AGO + 60,
        "messages": [
            {"role": "user", "content": "Old Zorilla: say hi.", "created_at": A_YEAR_AGO},
            {"role": "assistant", "content": "Hi.", "created_at": A_YEAR_AGO + 60},
        ],
    }
    path = tmp_path / "old-zorilla.json"
    path.write_text(json.dumps(exported), encoding="utf-8")
    page = open_page(1280, 800)
    pick_import_file(page, path)
    page.locator(USER, has_text="Old Zorilla: say hi.").wait_for(timeout=15_000)
    labels = page.locator("#conv-list label")
    titles = [t.split(" · ")[0].lstrip("● ") for t in labels.all_inner_texts()]
    assert titles.index("Old Zorilla") > titles.index("Recent Zorilla"), titles
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        imported = next(c for c in store.list() if c.title == "Old Zorilla")
    assert imported.updated_at == pytest.approx(A_YEAR_AGO + 60), imported.updated_at


EMPTY_UNDER_THE_COMPOSER_JS = """() => document.documentElement.scrollHeight - Math.max(
  ...['#send-btn', '#context-meter'].map((s) => document.querySelector(s).getBoundingClientRect().bottom + scrollY))"""


# the message box's placeholder: its width as drawn in the box's font, and the box's room for it
PLACEHOLDER_JS = """() => {
  const box = document.querySelector('#msg-input textarea'), style = getComputedStyle(box);
  const context = document.createElement('canvas').getContext('2d');
  context.font = style.font;
  const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return {text: box.placeholder, width: context.measureText(box.placeholder).width, room};
}"""


def test_on_a_phone_the_chat_takes_the_room_under_the_send_row(open_page, app):
    """On a phone (390x844) a band of ~100 px lay empty under Send and the meter: the chat was
    55% of the screen's height, whatever room the rest left. The chat takes it; what is left under
    them is the page's margin, and with the versions bar shown Stop is still on the screen. The
    box's placeholder was cut ("Message (Enter sends, Shift+Ent"): it fits, on a phone and on
    a wide screen."""
    chat_id = stored_long_chat(app, "Narrow Quoll", turns=2)
    wide = open_page(1280, 800, chat_id=chat_id)
    placeholder = wide.evaluate(PLACEHOLDER_JS)
    assert "Shift+Enter" in placeholder["text"] and placeholder["width"] <= placeholder["room"]
    page = open_page(390, 844, chat_id=chat_id, phone=True)
    assert wait_until(lambda: page.evaluate(PLACEHOLDER_JS)["text"].startswith("Message"), 5)
    placeholder = page.evaluate(PLACEHOLDER_JS)
    assert placeholder["width"] <= placeholder["room"], placeholder
    assert wait_until(lambda: page.evaluate(EMPTY_UNDER_THE_COMPOSER_JS) <= 40, 10), (
        page.evaluate(EMPTY_UNDER_THE_COMPOSER_JS),
        page.locator("#chatbot").bounding_box(),
    )
    assert page_height(page) <= 844, page_height(page)
    pick_message(page, "Narrow Quoll question 1")
    page.evaluate("scrollTo(0, 0)")
    stop = page.locator("#stop-btn").bounding_box()
    assert stop["y"] + stop["height"] <= 844, f"Stop is below the first screen: {stop}"


def test_on_a_wide_screen_the_chat_takes_the_room_under_the_send_row(open_page, app):
    """At 1280x800 a band of ~90 px lay empty under the Send row: the chat's height left room for
    a versions bar that was not shown. The chat takes the room the rest leaves, with the versions
    bar and without it, and with a long message in the box (dark mode here)."""
    chat_id = stored_long_chat(app, "Wide Quoll", turns=2)
    page = open_page(1280, 800, dark=True, chat_id=chat_id)

    def band() -> int:  # under the message box's row (Send sits at its top while the box is tall)
        return page.evaluate(
            "() => document.documentElement.scrollHeight - scrollY"
            " - document.querySelector('#composer').getBoundingClientRect().bottom"
        )

    assert wait_until(lambda: band() <= 40, 10), (band(), page.locator("#chatbot").bounding_box())
    pick_message(page, "Wide Quoll question 1")
    page.fill(BOX, "Long text line with many words for the layout test. " * 25)
    for _ in range(2):  # the versions bar shown, a long message in the box; then neither
        assert wait_until(lambda: band() <= 40 and page_height(page) <= 800, 10), (
            band(),
            page_height(page),
        )
        page.fill(BOX, "")
        page.click("#new-chat-btn")
        page.locator("#versions").wait_for(state="hidden", timeout=10_000)


# ---- 8. a page whose app stopped says so, and Enter says why nothing was sent


def test_a_page_whose_app_stopped_says_so_and_enter_keeps_the_message(browser, app):
    """With the app stopped, the page's status line kept "Ready · 0 running", the page never
    showed its note that it cannot reach the app (the note was looked at only when a tick was
    asked or answered, and no tick was asked once the app was gone), and Enter emptied the box
    and said nothing. The note shows within seconds, the status line says "Not connected", and
    Enter says the message was not sent, leaving it in the box."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(app.page_url)
        wait_page_loaded(page)
        note = page.locator("#unreachable-note")
        assert not note.is_visible()
        app.stop()
        stopped = time.monotonic()
        note.wait_for(state="visible", timeout=15_000)
        # within seconds: it waited 8 s for a tick's answer, Gradio's toast alone saying it until then
        assert time.monotonic() - stopped < 6, time.monotonic() - stopped
        assert "cannot reach the app" in note.inner_text()
        # the status line no longer says "Ready · 0 running" (tour item N: it kept saying so)
        status = page.locator("#status-line")
        assert "Ready" not in status.inner_text(), status.inner_text()
        shown = status.evaluate("(e) => getComputedStyle(e, '::before').content")
        assert "Not connected" in shown, shown
        page.fill(BOX, "Are you there, Kinkajou?")
        page.press(BOX, "Enter")
        assert wait_until(lambda: "not sent" in note.inner_text(), 5), note.inner_text()
        time.sleep(1)
        assert page.input_value(BOX) == "Are you there, Kinkajou?"
        page.click("#send-btn")
        assert page.input_value(BOX) == "Are you there, Kinkajou?"
        # said once: Gradio's "Connection to the server was lost" toast said it again, and the
        # note was in the browser's default font, not the page's
        errors = page.locator(".toast-body.error")
        assert wait_until(lambda: errors.count() > 0, 10), "Gradio's toast never came"
        assert not errors.first.is_visible(), errors.all_inner_texts()
        fonts = [
            page.evaluate(f"getComputedStyle(document.querySelector('{s}')).fontFamily")
            for s in ("#unreachable-note", "#chatbot")
        ]
        assert fonts[0] == fonts[1], fonts
    finally:
        context.close()
        app.start_again()


# ---- N4. a message's accessible name has no invisible marks


MARKED_NAMES_JS = """() => [...document.querySelectorAll('#chatbot [aria-label], #chatbot [title]')]
  .flatMap((e) => [e.getAttribute('aria-label') || '', e.getAttribute('title') || ''])
  .filter((name) => /[\\u2060\\u2062\\u2063]/.test(name))"""


def test_a_messages_accessible_name_has_no_invisible_marks(open_page, app):
    """A message's aria-label (what a screen reader says) carried the page's invisible marks
    (U+2063 around inline math, U+2062 in an image's link, U+2060 after a "<" shown as typed):
    they are taken out of the names in the chat."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Marked Mara")
        store.append(conv.id, "user", "Mara: is <b> a tag? And $x^2$?")
        store.append(
            conv.id,
            "assistant",
            "Yes, <b> is a tag; $x^2$ is math. ![a mara](https://x.test/m.png)",
        )
    page = open_page(1280, 800, chat_id=conv.id)
    page.locator(REPLY).first.locator(".katex").first.wait_for(timeout=10_000)
    named = page.locator("#chatbot [aria-label*='Mara']")
    assert wait_until(lambda: named.count() > 0, 5)
    assert wait_until(lambda: not page.evaluate(MARKED_NAMES_JS), 5), page.evaluate(MARKED_NAMES_JS)


# ---- N5. the settings' sliders: a label on one line, what 0 or 1 means under it across the panel


def test_each_sliders_label_fits_one_line_and_its_meaning_spans_the_panel(open_page, app):
    """ "Repetition penalty (1 = off)" wrapped over two lines beside its number box, and a line
    saying what a value means sat beside the box too, wrapped in a column ~120 px wide. Each
    label is one line; its meaning takes the panel's width under it."""
    page = open_page(1280, 800)
    page.get_by_text("Settings", exact=True).first.click()
    for slider in ("#temperature", "#top-p", "#repetition-penalty"):
        page.locator(slider).scroll_into_view_if_needed()
        label = page.locator(f"{slider} [data-testid=block-info]").bounding_box()
        meaning = page.locator(f"{slider} .info-text").bounding_box()
        whole = page.locator(slider).bounding_box()
        assert label["height"] < 32, (slider, label)  # one line of text and its padding
        assert meaning["width"] > 0.8 * whole["width"], (slider, meaning, whole)
