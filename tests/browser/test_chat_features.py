"""The chat page's conversation features, as a person uses them in Debian's Chromium (Playwright),
against the real app (`minisgl-chat chat`, demo model): versions (Retry, Edit, ‹ ›), Continue,
deleting a message, import and export, search, attachments, stop strings and seeds.

The session's chat app and one browser serve the module (the app is restarted once, on the same
data folder); each test opens its own tab. Where text is compared, replies are greedy
(temperature 0) or seeded, and short. Chats that need no model (delete, search, import) are made by importing a file, so
only the features that generate wait for the engine. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    ARTIFACTS,
    BROWSER_MARKS,
    LINE,
    REPLY,
    USER,
    attach_file,
    attached_line,
    below,
    browser,
    chat_lines,
    empty_button_boxes,
    open_chat_list,
    open_new_chat,
    put_setting,
    send,
    wait_page_loaded,
    whole_on_screen,
)
from server_utils import wait_until

from minisgl_app.chat.composing import branch_note

pytestmark = BROWSER_MARKS

ROW = "#chatbot .message-row:not(:has(.thought-group))"  # one per message (not its stats or version line)
ANY_ROW = "#chatbot .message-row"  # messages and the lines under them, each a row of its own
SIDEBAR = "#conv-list label"
REPLY_WAIT_S = 120  # a loaded 2-core machine is slow


# ---- the app and the browser


@pytest.fixture
def app(chat_app):
    """The chat app of conftest.py (restartable on the same data folder), which test_browser,
    test_chat_page and test_web_security share."""
    return chat_app


@pytest.fixture
def page(browser, app):
    """A tab of its own (its own session), closed after the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    tab = context.new_page()
    open_app(tab, app)
    yield tab
    context.close()


# ---- helpers: what a person does and sees


def open_app(page, app) -> None:
    page.goto(app.page_url)
    wait_page_loaded(page, "Ready", 180)


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"features-{name}.png"), full_page=True)


def replies(page) -> list[str]:
    return [t.strip() for t in page.locator(REPLY).all_inner_texts()]


def users(page) -> list[str]:
    return [t.strip() for t in page.locator(USER).all_inner_texts()]


def lines(page) -> list[str]:
    """The lines under messages: a reply's stats (with its version), a user message's version."""
    return [t.strip() for t in page.locator(LINE).all_inner_texts()]


def last_line(page) -> str:
    found = lines(page)
    return found[-1] if found else ""


def versions_label(page) -> str:
    label = page.locator("#versions-label")
    return label.inner_text().strip() if page.locator("#versions").is_visible() else ""


def toasts(page) -> str:
    return " | ".join(page.locator(".toast-body").all_inner_texts())


def close_toasts(page) -> None:
    for button in page.locator(".toast-close").all():
        try:
            button.click(timeout=2_000)
        except Exception:
            pass
    wait_until(lambda: page.locator(".toast-body").count() == 0, 5)


def engine_idle(app) -> bool:
    m = app.metrics()
    return m.get("minisgl_running_requests") == 0 and m.get("minisgl_waiting_requests", 0) == 0


def reply_done(page, *, tokens: int | None = None, version: str | None = None) -> bool:
    """The last reply has finished: its stats line shows its token count (and the version)."""
    line = last_line(page)
    if "replying" in line or not re.search(r"\d+ tokens", line):
        return False
    if tokens is not None and f"{tokens} tokens" not in line:
        return False
    return version is None or version in line


def wait_reply(page, app, what: str, **expect) -> None:
    ok = wait_until(lambda: reply_done(page, **expect), REPLY_WAIT_S, interval=0.2)
    if not ok:
        shot(page, f"timeout-{what}")
    assert ok, (
        f"{what}: the reply did not finish as expected ({expect}); lines: {lines(page)}; toasts: {toasts(page)}"
    )
    assert wait_until(lambda: engine_idle(app), 30), app.metrics()


def open_settings(page) -> None:
    if not page.locator("#max-tokens input").is_visible():
        page.click("#settings >> text=Settings")
        page.wait_for_selector("#max-tokens input", state="visible")


def set_settings(
    page,
    *,
    temperature=None,
    max_tokens=None,
    seed=None,
    stop=None,
    repetition_penalty=None,
    system_prompt=None,
) -> None:
    """Put in the settings fields; each is saved when left (Tab)."""
    open_settings(page)
    fields = [
        ("#system-prompt textarea", system_prompt),
        ("#temperature input[type=number]", temperature),
        ("#max-tokens input", max_tokens),
        ("#seed input", seed),
        ("#stop-strings textarea", stop),
        ("#repetition-penalty input[type=number]", repetition_penalty),
    ]
    for selector, value in fields:
        if value is not None:
            put_setting(page, selector, str(value))
    time.sleep(1.0)  # the save is sent; nothing on the page confirms it


def new_chat(page, **settings) -> None:
    open_new_chat(page)
    set_settings(page, **settings)


def open_manage(page) -> None:
    if not page.locator("#import-btn").is_visible():
        page.click("text=Manage")
        page.wait_for_selector("#import-btn", state="visible")


def import_file(page, path: Path) -> None:
    open_manage(page)
    with page.expect_file_chooser() as chooser:
        page.click("#import-btn")
    chooser.value.set_files(str(path))


def sidebar(page) -> list[str]:
    return [t.strip() for t in page.locator(SIDEBAR).all_inner_texts()]


def import_note(page) -> str:
    return (
        page.inner_text("#import-note").strip() if page.locator("#import-note").is_visible() else ""
    )


def covered(page, selector: str) -> list[str]:
    """What lies over the first shown element of ``selector`` (its centre and corners, inset 2 px)."""
    return page.evaluate(
        """(selector) => {
      const el = [...document.querySelectorAll(selector)].find(e => e.getClientRects().length);
      if (!el) return ['nothing matches ' + selector];
      const r = el.getBoundingClientRect(), out = [];
      for (const [x, y] of [[r.left + r.width / 2, r.top + r.height / 2], [r.left + 2, r.top + 2], [r.right - 2, r.top + 2],
                            [r.left + 2, r.bottom - 2], [r.right - 2, r.bottom - 2]]) {
        const top = document.elementFromPoint(x, y);
        if (top && !el.contains(top)) out.push((top.closest('[class]') || top).className + ' at ' + Math.round(x) + ',' + Math.round(y));
      }
      return out;
    }""",
        selector,
    )


def select_chat(page, title: str) -> None:
    open_chat_list(page)
    label = page.locator(SIDEBAR, has_text=title).first
    assert wait_until(lambda: label.count() > 0, 30), (
        f"no {title!r} in the sidebar 30 s on: it lists {sidebar(page)}; status line: {page.inner_text('#status-line')!r}"
    )
    label.click()


def row_buttons(page, index: int, rows: str = ROW):
    """Hover message ``index`` (0: the first user message, 1: its reply, ...); its buttons."""
    row = page.locator(rows).nth(index)
    row.hover()
    return row, row.locator("xpath=following-sibling::div[contains(@class, 'message-buttons')][1]")


def retry(page) -> None:
    _, buttons = row_buttons(
        page, page.locator(ANY_ROW).count() - 1, ANY_ROW
    )  # under the last line
    buttons.locator("button[aria-label='Retry']").click()


def edit(page, index: int, new_text: str, *, enter: bool = False) -> None:
    """✎ on message ``index``, type the new text, ✓ (or Enter, as a person does in a text box)."""
    row, buttons = row_buttons(page, index)
    buttons.locator("button[aria-label='Edit']").click()
    box = row.locator("textarea.edit-textarea").first
    box.wait_for(state="visible")
    box.fill(new_text)
    if enter:
        box.press("Enter")
    else:
        buttons.locator("button[aria-label='Submit']").click()


def prev_version(page) -> None:
    page.click("#prev-version-btn")


def next_version(page) -> None:
    page.click("#next-version-btn")


def shows(
    page, label: str, *, reply: str | None = None, user: str | None = None, index: int = -1
) -> bool:
    """The versions bar says ``label`` and the chat shows that version's text."""
    if label not in versions_label(page):
        return False
    if reply is not None:
        r = replies(page)
        if not r or r[index] != reply:
            return False
    if user is not None:
        u = users(page)
        if not u or u[index] != user:
            return False
    return True


def expect_shown(page, label: str, what: str, **kw) -> None:
    ok = wait_until(lambda: shows(page, label, **kw), 20, interval=0.1)
    if not ok:
        shot(page, f"failed-{what}")
    assert ok, (
        f"{what}: expected the bar to say {label!r} with {kw}; the bar says {versions_label(page)!r}, "
        f"replies {replies(page)}, your messages {users(page)}"
    )


def version_line_looks_like_a_line(page) -> None:
    """The version line under a question of yours (version 2/2) sat in a bubble of its own, tinted
    as your messages are and empty-looking around its small text: it is a small line with no bubble,
    right under the question's buttons, its right edge at the question's."""
    look = page.evaluate("""() => {
      const row = document.querySelector('#chatbot .message-row.user-row:has(.thought-group)');
      const question = row.previousElementSibling.previousElementSibling.querySelector('.message');
      const bubble = getComputedStyle(row.querySelector('.message')), group = getComputedStyle(row.querySelector('.thought-group'));
      const line = row.querySelector('.message').getBoundingClientRect(), above = question.getBoundingClientRect();
      return {bubble: bubble.backgroundColor, group: group.backgroundColor, border: group.borderLeftWidth, height: line.height,
              gap: line.top - above.bottom, right: above.right - line.right};
    }""")
    assert look["bubble"] == look["group"] == "rgba(0, 0, 0, 0)" and look["border"] == "0px", (
        f"the version line is drawn as a bubble: {look}"
    )
    assert look["height"] <= 36 and look["gap"] <= 40 and abs(look["right"]) <= 12, (
        f"the version line is not a small line under its message: {look}"
    )


def write_json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# ---- 1. versions of a reply: Retry, ‹ ›, kept across reload and restart


def test_regenerate_keeps_the_old_version_across_reload_and_restart(browser, app):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    open_app(page, app)
    # Greedy both times; the first reply is cut at 3 tokens, the second may say more, so the two
    # versions differ in a known way.
    new_chat(page, temperature=0, max_tokens=3)
    send(page, "What is the capital of France? (versions test)")
    wait_reply(page, app, "first reply", tokens=3)
    first = replies(page)[-1]
    assert first
    set_settings(page, max_tokens=16)
    retry(page)
    wait_reply(page, app, "regenerated reply", version="version 2/2")
    second = replies(page)[-1]
    assert second != first and second.startswith(first.split()[0]), (first, second)
    assert len(page.locator(REPLY).all()) == 1, (
        "a regenerated reply must replace the shown one, not add a message"
    )
    expect_shown(page, "Reply 1: version 2 of 2", "after Retry", reply=second)
    shot(page, "01-regenerated")

    prev_version(page)
    expect_shown(page, "Reply 1: version 1 of 2", "‹ after Retry", reply=first)
    assert "version 1/2" in last_line(page)
    next_version(page)
    expect_shown(page, "Reply 1: version 2 of 2", "› after Retry", reply=second)
    prev_version(page)  # the branch chosen: the first version
    expect_shown(page, "Reply 1: version 1 of 2", "‹ again", reply=first)

    page.reload()
    page.wait_for_selector(REPLY, timeout=60_000)
    select_chat(page, "versions test")
    expect_shown(page, "Reply 1: version 1 of 2", "after a reload", reply=first)
    shot(page, "01-after-reload")
    next_version(page)
    expect_shown(page, "Reply 1: version 2 of 2", "› after a reload", reply=second)
    prev_version(page)
    expect_shown(page, "Reply 1: version 1 of 2", "‹ after a reload", reply=first)
    context.close()

    app.restart()
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    open_app(page, app)
    select_chat(page, "versions test")
    page.wait_for_selector(REPLY, timeout=60_000)
    expect_shown(page, "Reply 1: version 1 of 2", "after a restart", reply=first)
    shot(page, "01-after-restart")
    next_version(page)
    expect_shown(page, "Reply 1: version 2 of 2", "› after a restart", reply=second)
    prev_version(page)
    expect_shown(page, "Reply 1: version 1 of 2", "‹ after a restart", reply=first)
    context.close()


# ---- 2. editing a user message that is not the last


def test_editing_an_earlier_question_answers_it_again_and_keeps_the_old_branch(page, app, tmp_path):
    q1, a1 = "What is the capital of France?", "Paris is the capital of France."
    q2, a2 = "And what is its most famous tower?", "The Eiffel Tower."
    import_file(
        page,
        write_json(
            tmp_path / "two-turns.json",
            {
                "title": "Edit question test",
                "messages": [
                    {"role": "user", "content": q1},
                    {"role": "assistant", "content": a1},
                    {"role": "user", "content": q2},
                    {"role": "assistant", "content": a2},
                ],
            },
        ),
    )
    assert wait_until(lambda: users(page) == [q1, q2] and replies(page) == [a1, a2], 30), (
        users(page),
        replies(page),
    )
    set_settings(page, temperature=0, max_tokens=12)

    edited = "What is the capital of Italy?"
    edit(page, 0, edited)
    wait_reply(page, app, "answer to the edited question", tokens=None)
    shot(page, "02-edited-question")
    after_edit = toasts(page)  # checked last, so that the rest is checked too
    assert users(page) == [edited], (
        f"the chat below the edited question must be replaced: {users(page)}"
    )
    assert len(replies(page)) == 1 and replies(page)[0] not in ("", a1), replies(page)
    assert q2 not in page.inner_text("#chatbot") and a2 not in page.inner_text("#chatbot")
    expect_shown(page, "Your message 1: version 2 of 2", "after editing", user=edited, index=0)
    assert any("version 2/2" in x for x in lines(page)), lines(page)
    version_line_looks_like_a_line(page)
    # where the question's old reply and the turn after it went: in the versions bar, which acts
    # on the edited question (chat/composing.py: branch_note), not in a toast over the edited message
    assert versions_label(page) == f"Your message 1: version 2 of 2 — {branch_note(3)}", (
        versions_label(page)
    )
    # the long label wraps: Delete message stays on screen, beside it at 1280 px, on a phone
    # with the label on a line of its own under it (it pushed the button off / wrapped to 8 lines)
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 860})
        assert wait_until(
            lambda: (
                whole_on_screen(page, "#delete-message-btn")
                and whole_on_screen(page, "#versions-label")
            ),
            5,
        ), (
            width,
            page.locator("#delete-message-btn").bounding_box(),
            page.locator("#versions-label").bounding_box(),
        )
        label = page.locator("#versions-label").bounding_box()
        assert label["height"] <= 90, f"the label takes {label} at {width} px (four lines at most)"
    page.set_viewport_size({"width": 1280, "height": 860})
    new_answer = replies(page)[0]

    prev_version(page)
    expect_shown(page, "Your message 1: version 1 of 2", "‹ after editing", user=q1, index=0)
    assert users(page) == [q1, q2] and replies(page) == [a1, a2], (users(page), replies(page))
    next_version(page)
    expect_shown(page, "Your message 1: version 2 of 2", "› after editing", user=edited, index=0)
    assert replies(page) == [new_answer]
    assert after_edit == "", f"a toast after a plain edit of the question: {after_edit!r}"


# ---- 3. editing a reply


def test_editing_a_reply_makes_a_new_version_without_a_new_reply(page, app):
    new_chat(page, temperature=0, max_tokens=6)
    send(page, "Name a colour.")
    wait_reply(page, app, "the reply to edit")
    old = replies(page)[-1]
    assert old
    close_toasts(page)

    mine = "Green, said the editor."
    row, buttons = row_buttons(page, 1)
    buttons.locator("button[aria-label='Edit']").click()
    box = row.locator("textarea.edit-textarea").first
    box.fill("Green,")
    box.press("Shift+Enter")  # a new line, as in the message box: not saved yet
    assert box.is_visible() and box.input_value() == "Green,\n", box.input_value()
    box.press("Escape")  # cancelled: the reply stays as it was
    assert wait_until(lambda: not box.is_visible(), 5) and replies(page) == [old], replies(page)
    edit(page, 1, mine, enter=True)  # Enter saves
    expect_shown(page, "Reply 1: version 2 of 2", "after editing the reply", reply=mine)
    # its line said only "version 2/2" (details: "Ended."): it says who wrote it
    assert wait_until(lambda: "version 2/2 · edited by you" in chat_lines(page), 5), chat_lines(
        page
    )
    time.sleep(2.0)  # time for a reply to start, had one been asked for
    shot(page, "03-edited-reply")
    assert replies(page) == [mine], f"editing a reply must not generate another: {replies(page)}"
    assert app.metrics().get("minisgl_running_requests") == 0
    assert "replying" not in page.inner_text("#chatbot")
    assert empty_button_boxes(page) == 0, "an empty button box (a stray dot) is drawn in the chat"
    after_edit = toasts(page)  # checked last, so that the rest is checked too

    assert (
        page.locator("#next-version-btn").is_disabled()
        and page.locator("#prev-version-btn").is_enabled()
    ), "at the last version › must be disabled and ‹ not"
    prev_version(page)
    expect_shown(page, "Reply 1: version 1 of 2", "‹ after editing the reply", reply=old)
    assert wait_until(lambda: page.locator("#prev-version-btn").is_disabled(), 5), (
        "at the first version ‹ must be disabled"
    )
    assert page.locator("#next-version-btn").is_enabled()
    next_version(page)
    expect_shown(page, "Reply 1: version 2 of 2", "› after editing the reply", reply=mine)
    assert after_edit == "", (
        f"a warning after a plain edit of the reply (screenshot features-03-edited-reply): {after_edit}"
    )

    # a new message: the bar no longer names Reply 1 (a click on it brings its versions back)
    send(page, "Another one?")
    assert wait_until(lambda: not page.locator("#versions").is_visible(), 10), (
        f"the versions bar stays after a new message: {versions_label(page)!r}"
    )
    wait_reply(page, app, "the reply after the edited one")
    assert not page.locator("#versions").is_visible(), versions_label(page)


# every change of "is any ✎ disabled" on the page, with the line under the last message then
WATCH_EDIT_DISABLED_JS = """() => {
  window.minisglTestEditDisabled = [];
  let was = null;
  setInterval(() => {
    const edits = [...document.querySelectorAll('#chatbot button[aria-label="Edit"]')];
    const disabled = edits.length ? edits.some((b) => b.disabled) : null;
    if (disabled === was) return;
    was = disabled;
    const lines = [...document.querySelectorAll('#chatbot .thought-group')];
    window.minisglTestEditDisabled.push([disabled, lines.length ? lines[lines.length - 1].innerText : '']);
  }, 5);
}"""


def test_edit_is_not_disabled_after_a_new_chats_first_reply(page, app):
    """✎ did nothing when clicked a moment after a new chat's first reply (a CI failure of the
    test above): to give the title box the chat's title, the tick redrew the whole chat, and
    Gradio disables ✎ and ↻ while an event that writes the chat runs. The title box alone is
    redrawn: once the reply has finished, ✎ is never disabled again."""
    new_chat(page, temperature=0, max_tokens=24)
    open_manage(page)  # where the title box is
    page.evaluate(WATCH_EDIT_DISABLED_JS)
    send(page, "Name three colours.")
    wait_reply(page, app, "the first reply")
    title_box = page.locator("#title-input :is(input, textarea)")
    assert wait_until(
        lambda: title_box.count() and title_box.input_value() == "Name three colours.", 10
    ), "the title box did not get the chat's title"
    time.sleep(1.5)  # a tick more
    changes = page.evaluate("window.minisglTestEditDisabled")
    after_reply = [
        line
        for disabled, line in changes
        if disabled and re.search(r"\d+ tokens", line) and "replying" not in line
    ]
    assert not after_reply, (
        f"✎ was disabled after the reply had finished (its line then: {after_reply}); every change: {changes}"
    )


def test_the_edit_box_is_as_wide_as_the_message_and_grows_with_its_text(page, app, tmp_path):
    """✎ opened a box 160 px wide and two lines high, whatever the message: it is as wide as a
    message can be (at least the bubble it edits), three lines at least, and grows with the text."""
    import_file(
        page,
        write_json(
            tmp_path / "edit-box.json",
            {
                "title": "Edit box test",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Hello there! " * 30},
                ],
            },
        ),
    )
    assert wait_until(lambda: users(page) == ["hi"] and replies(page), 30), (
        users(page),
        replies(page),
    )
    for index in (0, 1):
        row, buttons = row_buttons(page, index)
        bubble = row.locator(".message").first.bounding_box()["width"]
        buttons.locator("button[aria-label='Edit']").click()
        box = row.locator("textarea.edit-textarea").first
        box.wait_for(state="visible")
        for name in ("Submit", "Cancel"):  # ✓ and ✕ were 18 px icons
            icon = buttons.locator(f"button[aria-label='{name}']").bounding_box()
            assert icon["width"] >= 28 and icon["height"] >= 28, (
                f"message {index}: {name} is a {icon['width']}x{icon['height']} px target"
            )
        width = box.bounding_box()["width"]
        height, line = box.evaluate(
            "t => [t.clientHeight, parseFloat(getComputedStyle(t).lineHeight)]"
        )
        assert width >= max(0.95 * bubble, 600), (
            f"message {index}: the edit box is {width:.0f} px wide (its bubble {bubble:.0f} px)"
        )
        assert height >= 3 * line, (
            f"message {index}: the edit box is {height} px high, under three lines of {line} px"
        )
        box.fill("\n".join(f"line {i}" for i in range(8)))
        height, scrolled = box.evaluate("t => [t.clientHeight, t.scrollHeight]")
        assert height >= 8 * line and scrolled <= height + 1, (
            f"message {index}: eight lines in a box {height} px high ({scrolled} px of text)"
        )
        box.press("Escape")
        assert wait_until(lambda: not box.is_visible(), 5)


def test_a_code_blocks_copy_button_never_lies_over_its_code(page, app, tmp_path):
    """The copy button at a code block's top right corner lay over the text of a one-line block
    (and over a long first line, scrolled sideways or not)."""
    one_line = (
        "pip install --upgrade minisgl-chat-with-a-rather-long-package-name-that-fills-the-block "
        * 2
    )
    import_file(
        page,
        write_json(
            tmp_path / "code.json",
            {
                "title": "Code copy test",
                "messages": [
                    {"role": "user", "content": "Show me code."},
                    {
                        "role": "assistant",
                        "content": f"Short:\n\n```\nls\n```\n\nOne line:\n\n```\n{one_line}\n```\n\n"
                        f"Two lines:\n\n```python\n{one_line}\nprint(2)\n```",
                    },
                ],
            },
        ),
    )
    assert wait_until(lambda: page.locator("#chatbot .code_wrap").count() == 3, 30), replies(page)
    overlaps = page.evaluate("""() => [...document.querySelectorAll('#chatbot .code_wrap')].flatMap((wrap, i) => {
        const button = wrap.querySelector('.copy_code_button').getBoundingClientRect(), pre = wrap.querySelector('pre');
        const found = [];
        for (const at of [0, 0.5, 1]) {  // scrolled sideways to its start, middle and end
          pre.scrollLeft = at * (pre.scrollWidth - pre.clientWidth);
          const range = document.createRange();
          range.selectNodeContents(pre.querySelector('code'));
          for (const r of range.getClientRects()) {
            const visible = r.right > pre.getBoundingClientRect().left && r.left < pre.getBoundingClientRect().right;
            if (visible && r.width && r.left < button.right && r.right > button.left && r.top < button.bottom && r.bottom > button.top)
              found.push(`block ${i} scrolled to ${at}: text at ${Math.round(r.left)},${Math.round(r.top)} under the button`);
          }
        }
        return found;
      })""")
    assert not overlaps, overlaps
    assert page.locator("#chatbot .copy_code_button").first.is_visible()


def test_the_scroll_down_button_does_not_cover_the_chat(page, app, tmp_path):
    """Gradio's ↓ (shown once the chat is scrolled up) floated over the last lines of text."""
    words = " ".join(f"word{j}" for j in range(150))
    import_file(
        page,
        write_json(
            tmp_path / "long.json",
            {
                "title": "Scroll button test",
                "messages": [
                    m
                    for i in range(4)
                    for m in (
                        {"role": "user", "content": f"Question {i}"},
                        {"role": "assistant", "content": words},
                    )
                ],
            },
        ),
    )
    assert wait_until(lambda: len(replies(page)) == 4, 30), replies(page)
    button = page.locator("#chatbot .scroll-down-button-container button")
    seen: list = []

    def scrolled_up() -> bool:
        """Scrolled up, the chat's text area and ↓, measured at once (a render of the chat just
        imported scrolls it to its end again, and ↓ goes)."""
        seen[:] = [
            page.evaluate("""() => {
            const text = document.querySelector('#chatbot .bubble-wrap'), b = document.querySelector('#chatbot .scroll-down-button-container button');
            if (!b || !b.getClientRects().length) { text.scrollTop = text.scrollHeight - text.clientHeight - 200; return null; }
            return [text.getBoundingClientRect().bottom, b.getBoundingClientRect().top]; }""")
        ]
        return seen[0] is not None

    assert wait_until(scrolled_up, 10, interval=0.3), "no ↓ once the chat is scrolled up"
    text_bottom, button_top = seen[0]
    assert button_top >= text_bottom, (
        f"↓ (top at {button_top:.0f} px) is drawn over the chat's text (down to {text_bottom:.0f} px)"
    )
    assert wait_until(lambda: scrolled_up() and button.is_visible(), 10)
    button.click()
    assert wait_until(lambda: button.count() == 0, 10), "↓ stays after it was pressed"
    assert (
        page.evaluate(
            "() => { const w = document.querySelector('#chatbot .bubble-wrap'); return w.scrollHeight - w.clientHeight - w.scrollTop; }"
        )
        < 2
    )


# ---- 4. Continue


def message_box_width(page) -> float:
    return page.locator("#msg-input textarea").bounding_box()["width"]


def test_continue_grows_the_same_reply_and_leaves_the_message_box_as_wide(page, app):
    """Continue grows the reply it continues. It came and went as a fourth button in the message
    box's row, squeezing the box: the box keeps its width while it shows, is pressed, and goes."""
    new_chat(page, temperature=0, max_tokens=8)
    width = message_box_width(page)
    send(page, "Write a long story about a dragon who learns to cook.")
    wait_reply(page, app, "cut reply", tokens=8)
    assert "hit the token limit" in last_line(page), last_line(page)
    cut = " ".join(replies(page)[-1].split())
    assert page.locator("#continue-btn").is_visible(), (
        "Continue must show under a reply cut at max tokens"
    )
    assert message_box_width(page) == width, (
        f"the message box went from {width} to {message_box_width(page)} px with Continue shown"
    )
    shot(page, "04-cut")

    page.click("#continue-btn")
    # hidden while the reply goes on; 8 more tokens may take the demo model only ~0.1 s, and then
    # Continue is back under the reply cut again
    assert wait_until(
        lambda: not page.locator("#continue-btn").is_visible() or reply_done(page, tokens=16), 15
    ), "Continue stays while the reply goes on"
    assert message_box_width(page) == width, (
        f"the message box went from {width} to {message_box_width(page)} px once Continue was pressed"
    )
    wait_reply(page, app, "continued reply", tokens=16)
    assert message_box_width(page) == width, (
        f"the message box went from {width} to {message_box_width(page)} px after Continue"
    )
    shot(page, "04-continued")
    shown = replies(page)
    assert len(shown) == 1, f"Continue must grow the same message, not add one: {shown}"
    grown = " ".join(shown[0].split())
    assert len(grown) > len(cut) and grown.startswith(cut), (cut, grown)
    assert "version" not in last_line(page), f"Continue is not a new version: {last_line(page)}"


def test_a_continue_that_adds_nothing_keeps_the_figures_and_says_why(page, app):
    """A reply cut at max tokens just before the model's own end: Continue gets EOS first. The
    reply's time to first token and tok/s vanished and nothing said why; they stay, and a toast
    says the model had nothing to add."""
    question = "What is the capital of France?"
    new_chat(page, temperature=0, max_tokens=64, repetition_penalty=1)
    send(page, question)
    wait_reply(page, app, "whole reply")
    whole = int(re.search(r"(\d+) tokens", last_line(page)).group(1))
    for max_tokens in (whole, whole - 1):  # whether the count holds the end token or not
        new_chat(page, temperature=0, max_tokens=max_tokens, repetition_penalty=1)
        send(page, question)
        wait_reply(page, app, "reply cut at its end", tokens=max_tokens)
        if "hit the token limit" in last_line(page):
            break
    assert page.locator("#continue-btn").is_visible(), last_line(page)
    before = last_line(page)
    assert "s to first token" in before and "tok/s" in before, before
    page.click("#continue-btn")
    assert wait_until(lambda: "nothing to add" in toasts(page), 15), (toasts(page), lines(page))
    # the toast may come before the render that ends the run's "replying…" (a CI run under load)
    assert wait_until(lambda: "replying" not in last_line(page), 15), last_line(page)
    after = last_line(page)
    assert before.split(" · ")[:2] == after.split(" · ")[:2], (
        before,
        after,
    )  # time to first token, tok/s
    # the button goes with the render that ends the run, which the toast (said as the run ends) can precede
    assert wait_until(lambda: not page.locator("#continue-btn").is_visible(), 15), last_line(page)
    shot(page, "04-continue-nothing-to-add")


# ---- 5. deleting one message


def test_deleting_a_message_removes_it_and_what_follows_unless_dismissed(page, app, tmp_path):
    msgs = [
        ("user", "First question about otters."),
        ("assistant", "Otters hold hands."),
        ("user", "Second question about otters."),
        ("assistant", "Otters use stones."),
        ("user", "Third question about otters."),
        ("assistant", "Otters live in rivers."),
    ]
    import_file(
        page,
        write_json(
            tmp_path / "otters.json",
            {
                "title": "Delete message test",
                "messages": [{"role": r, "content": c} for r, c in msgs],
            },
        ),
    )
    assert wait_until(lambda: len(users(page)) == 3 and len(replies(page)) == 3, 30), (
        users(page),
        replies(page),
    )

    page.set_viewport_size(
        {"width": 420, "height": 800}
    )  # a phone: the chats' bar, then the chat, every label whole
    page.locator(USER).nth(1).click()  # the versions bar now acts on the second question
    assert wait_until(lambda: versions_label(page) == "Your message 2", 10), versions_label(
        page
    )  # its only version
    assert (
        not page.locator("#prev-version-btn").is_visible()
        and not page.locator("#next-version-btn").is_visible()
    ), "‹ › shown for a message with no other version"
    assert below(page, "#sidebar-bar", "#main") and not page.locator("#conv-list").is_visible(), (
        "on a narrow screen the chat does not come right after the chats' bar"
    )
    for control in ("#delete-message-btn", "#msg-input textarea", "#send-btn", "#stop-btn"):
        assert whole_on_screen(page, control), (
            f"{control} is cut or off screen at 420 px: {page.locator(control).bounding_box()}"
        )
    stop = page.locator("#stop-btn").bounding_box()
    assert stop["y"] + stop["height"] <= 800, f"Stop is below the first screen: {stop}"

    page.once("dialog", lambda d: d.dismiss())
    page.click("#delete-message-btn")
    time.sleep(2.0)
    assert users(page) == [c for r, c in msgs if r == "user"] and replies(page) == [
        c for r, c in msgs if r == "assistant"
    ], "dismissing the question must keep every message"

    questions = []
    page.once("dialog", lambda d: (questions.append(d.message), d.accept()))
    page.click("#delete-message-btn")
    assert wait_until(lambda: len(users(page)) == 1, 15), users(page)
    shot(page, "05-deleted")
    assert questions and "Delete this message" in questions[0]
    assert users(page) == ["First question about otters."] and replies(page) == [
        "Otters hold hands."
    ], (users(page), replies(page))
    # after a reload the deletion is still there
    page.reload()
    page.wait_for_selector("#msg-input textarea", timeout=60_000)
    select_chat(page, "Delete message test")
    assert wait_until(lambda: users(page) == ["First question about otters."], 20), users(page)


# ---- 6. import and export


def test_import_openai_file_our_export_round_trips_and_bad_files_are_refused(page, app, tmp_path):
    doc = {
        "messages": [
            {"role": "system", "content": "You are a terse librarian."},
            {"role": "user", "content": "Recommend a book about lighthouses."},
            {"role": "assistant", "content": "Try The Lighthouse Stevensons."},
            {"role": "user", "content": "Another one?"},
            {"role": "assistant", "content": "The Lamplighter's Log."},
        ]
    }
    before = len(sidebar(page))
    import_file(page, write_json(tmp_path / "openai.json", doc))
    assert wait_until(
        lambda: users(page) == ["Recommend a book about lighthouses.", "Another one?"], 30
    ), users(page)
    assert replies(page) == ["Try The Lighthouse Stevensons.", "The Lamplighter's Log."]
    assert wait_until(lambda: len(sidebar(page)) == before + 1, 10), sidebar(page)
    assert any("Recommend a book about lighthouses" in s for s in sidebar(page)), sidebar(page)
    # what was imported is said under the Import button; nothing lies over the chat it shows (a
    # toast did, over its first message and that message's buttons, for ten seconds)
    assert wait_until(
        lambda: "Imported “Recommend a book about lighthouses" in import_note(page), 10
    ), import_note(page)
    assert "(4 messages shown)" in import_note(page) and not toasts(page), (
        import_note(page),
        toasts(page),
    )
    row_buttons(page, 0)  # hovered: its buttons show
    assert not covered(page, USER) and not covered(page, "#chatbot .message-buttons-right"), (
        covered(page, USER),
        covered(page, "#chatbot .message-buttons-right"),
    )
    open_settings(page)
    assert page.input_value("#system-prompt textarea") == "You are a terse librarian."
    shot(page, "06-imported")

    # a second version of the last reply, so that the export has a branch
    close_toasts(page)
    edit(page, 3, "The Keeper's Diary.")
    expect_shown(
        page,
        "Reply 2: version 2 of 2",
        "edited before export",
        reply="The Keeper's Diary.",
        index=1,
    )

    open_manage(page)
    with page.expect_download() as download:
        page.click("#export-json-btn")
    exported = tmp_path / "exported.json"
    download.value.save_as(exported)
    assert json.loads(exported.read_text(encoding="utf-8"))["title"]

    before = len(sidebar(page))
    close_toasts(page)
    import_file(page, exported)
    assert wait_until(lambda: "(imported)” (4 messages shown)" in import_note(page), 30), (
        import_note(page)
    )
    assert wait_until(lambda: len(sidebar(page)) == before + 1, 10), sidebar(page)
    title = json.loads(exported.read_text(encoding="utf-8"))["title"]
    assert any(f"{title} (imported)" in s for s in sidebar(page)), (
        f"the copy cannot be told from its source: {sidebar(page)}"
    )
    assert users(page) == ["Recommend a book about lighthouses.", "Another one?"]
    assert replies(page) == ["Try The Lighthouse Stevensons.", "The Keeper's Diary."]
    expect_shown(
        page,
        "Reply 2: version 2 of 2",
        "the round-tripped chat",
        reply="The Keeper's Diary.",
        index=1,
    )
    prev_version(page)
    expect_shown(
        page,
        "Reply 2: version 1 of 2",
        "‹ in the round-tripped chat",
        reply="The Lamplighter's Log.",
        index=1,
    )
    assert page.input_value("#system-prompt textarea") == "You are a terse librarian."
    shot(page, "06-round-trip")

    # bad files: a warning says what is wrong (a file of another type: which files can be), no chat is made
    shown_before = (users(page), replies(page))
    count = len(sidebar(page))
    server_errors: list[str] = []
    page.on("response", lambda r: r.status >= 500 and server_errors.append(f"{r.status} {r.url}"))
    for name, body, words in [
        ("broken.json", "this is not JSON {", ["not JSON"]),
        (
            "robot.json",
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "robot", "content": "beep"},
                    ]
                }
            ),
            ["role", "robot"],
        ),
        (
            "notes.txt",
            "just some notes",
            ["notes.txt is not a .json file", "Export JSON", '{"messages": [...]}'],
        ),
    ]:
        close_toasts(page)
        path = tmp_path / name
        path.write_text(body, encoding="utf-8")
        import_file(page, path)
        assert wait_until(lambda: "Not imported" in toasts(page), 30), (
            f"{name}: no toast; toasts: {toasts(page)}"
        )
        assert below(page, "#status-line", ".toast-body"), "the toast covers the status line"
        assert not import_note(page), (
            f"{name}: the line of the import before stays: {import_note(page)}"
        )
        message = toasts(page)
        for word in words:
            assert word in message, f"{name}: the toast does not name what is wrong: {message}"
        assert page.locator(".toast-body.error").count() == 0, (
            f"{name}: an error toast, not a warning: {message}"
        )
        time.sleep(1.0)
        assert len(sidebar(page)) == count, f"{name}: a chat was made: {sidebar(page)}"
        assert (users(page), replies(page)) == shown_before
    assert not server_errors, server_errors
    shot(page, "06-bad-import")


# ---- 7. search


def test_search_narrows_the_sidebar_and_clearing_shows_all(page, app, tmp_path):
    import_file(
        page,
        write_json(
            tmp_path / "s1.json",
            {
                "title": "Gardening notes",
                "messages": [
                    {"role": "user", "content": "How do I grow zucchiniflower seedlings?"},
                    {"role": "assistant", "content": "Keep them warm."},
                ],
            },
        ),
    )
    assert wait_until(lambda: any("Gardening notes" in s for s in sidebar(page)), 30), sidebar(page)
    import_file(
        page,
        write_json(
            tmp_path / "s2.json",
            {
                "title": "Kitchen notes",
                "messages": [
                    {"role": "user", "content": "How long do I boil an egg?"},
                    {"role": "assistant", "content": "About nine minutes."},
                ],
            },
        ),
    )
    assert wait_until(lambda: any("Kitchen notes" in s for s in sidebar(page)), 30), sidebar(page)
    everything = len(sidebar(page))
    assert everything >= 2

    box = page.locator("#search input")
    box.click()
    box.press_sequentially("zucchiniflower")  # typed: a word only in a message, not in a title
    assert wait_until(lambda: len(sidebar(page)) == 1, 15), sidebar(page)
    assert "Gardening notes" in sidebar(page)[0]
    shot(page, "07-search")
    box.press_sequentially("zz")  # no chat has "zucchiniflowerzz": the list says so
    assert wait_until(
        lambda: not sidebar(page) and "No chat matches" in page.inner_text("#conv-list"), 15
    ), page.inner_text("#conv-list")
    box.press("Control+A")
    box.press("Backspace")  # the box is empty again
    assert box.input_value() == ""
    ok = wait_until(lambda: len(sidebar(page)) == everything, 15)
    shot(page, "07-search-cleared")
    assert ok, (
        f"the search box is empty but the sidebar still shows only {sidebar(page)} (all {everything} expected)"
    )


CONTRAST_JS = """(el) => {
  const rgba = (c) => { const n = c.match(/[\\d.]+/g).map(Number); const srgb = c.startsWith('color(srgb');
    return [...n.slice(0, 3).map(x => srgb ? x * 255 : x), n.length > 3 ? n[3] : 1]; };
  let back = [255, 255, 255];  // what lies under the element: its backgrounds, from the first opaque one up
  const layers = [];
  for (let e = el; e; e = e.parentElement) { const c = rgba(getComputedStyle(e).backgroundColor); layers.push(c); if (c[3] >= 1) break; }
  for (const [r, g, b, a] of layers.reverse()) back = [r * a + back[0] * (1 - a), g * a + back[1] * (1 - a), b * a + back[2] * (1 - a)];
  const lum = ([r, g, b]) => [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  const [l1, l2] = [lum(rgba(getComputedStyle(el).color)), lum(back)].sort((a, b) => b - a);
  return (l1 + 0.05) / (l2 + 0.05);
}"""


def test_the_selected_chat_in_the_list_is_readable(page, app, tmp_path):
    """The chat shown was listed in white on a light lavender (contrast 1.3:1): its text must
    stand out as other text does (WCAG's 4.5:1)."""
    import_file(
        page,
        write_json(
            tmp_path / "selected.json",
            {
                "title": "Selected chat test",
                "messages": [
                    {"role": "user", "content": "Which chat is this?"},
                    {"role": "assistant", "content": "The selected one."},
                ],
            },
        ),
    )
    selected = page.locator("#conv-list label.selected")
    assert wait_until(
        lambda: "Selected chat test" in (selected.inner_text() if selected.count() else ""), 30
    ), sidebar(page)
    ratio = selected.evaluate(CONTRAST_JS)
    assert ratio >= 4.5, (
        f"the selected chat's text has a contrast of {ratio:.2f}:1 with its background"
    )


# ---- 8. attachments


def test_attach_a_text_file_and_refuse_binary_or_oversized_ones(page, app, tmp_path):
    new_chat(page, temperature=0, max_tokens=4)
    bad = tmp_path / "latin1-notes.txt"
    bad.write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"))
    attach_file(page, bad)
    assert wait_until(lambda: "Not attached" in toasts(page), 30), toasts(page)
    assert "latin1-notes.txt" in toasts(page) and "UTF-8" in toasts(page), toasts(page)
    assert "latin1-notes" not in attached_line(page)
    close_toasts(page)

    picture = tmp_path / "picture.png"  # not a text file: our sentence, not Gradio's red "Error"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    attach_file(page, picture)
    assert wait_until(lambda: "Not attached" in toasts(page), 30), toasts(page)
    assert (
        "picture.png is not UTF-8 text" in toasts(page)
        and page.locator(".toast-body.error").count() == 0
    ), toasts(page)
    close_toasts(page)

    big = tmp_path / "huge-notes.txt"
    big.write_text("x" * 1_100_000, encoding="utf-8")
    attach_file(page, big)
    assert wait_until(lambda: "Not attached" in toasts(page), 30), toasts(page)
    assert "huge-notes.txt" in toasts(page) and "1 MB" in toasts(page), toasts(page)
    assert "huge-notes" not in attached_line(page)
    close_toasts(page)

    good = tmp_path / "launch-notes.txt"
    good.write_text("MARKER-7731: the launch code is plum.\n", encoding="utf-8")
    attach_file(page, good)
    assert wait_until(lambda: "launch-notes.txt" in attached_line(page), 30), attached_line(page)
    assert "Attached to your next message" in attached_line(page)
    assert toasts(page) == "", toasts(page)
    shot(page, "08-attached")

    send(page, "What does the file say?")
    assert wait_until(lambda: len(users(page)) == 1, 30), users(page)
    sent = users(page)[0]
    assert (
        "What does the file say?" in sent
        and "launch-notes.txt" in sent
        and "MARKER-7731: the launch code is plum." in sent
    ), sent
    assert "latin1-notes" not in sent and "huge-notes" not in sent
    assert wait_until(lambda: attached_line(page).strip() == "", 10), (
        "the attachment must go with one message only"
    )
    wait_reply(page, app, "reply to the attached file", tokens=None)
    shot(page, "08-sent")


def test_attach_pdf_and_word_documents_and_refuse_a_scan_or_a_long_pdf(page, app, tmp_path):
    """A PDF's pages (with their numbers) and a Word file's paragraphs and table go into the
    message; a PDF without text (a scan) and one of 500 pages are refused, saying why."""
    from documents_utils import blank_pdf, text_pdf, word_file

    new_chat(page, temperature=0, max_tokens=4)
    attach_file(page, blank_pdf(tmp_path / "scanned-letter.pdf"))
    assert wait_until(lambda: "scanned-letter.pdf has no text" in toasts(page), 30), toasts(page)
    close_toasts(page)
    attach_file(page, text_pdf(tmp_path / "long-book.pdf", [f"page {n}" for n in range(500)]))
    assert wait_until(lambda: "long-book.pdf has 500 pages" in toasts(page), 60), toasts(page)
    close_toasts(page)
    attach_file(
        page, text_pdf(tmp_path / "trip.pdf", ["MARKER-4410 leave at nine.", "Hotel Lune."])
    )
    assert wait_until(lambda: "trip.pdf" in attached_line(page), 30)
    attach_file(
        page, word_file(tmp_path / "menu.docx", ["MARKER-8812 soup first."], [["day", "dish"]])
    )
    assert wait_until(lambda: "menu.docx" in attached_line(page), 30)
    assert "long-book" not in attached_line(page) and "scanned" not in attached_line(page)
    send(page, "Where is the hotel?")
    assert wait_until(lambda: len(users(page)) == 1, 30), users(page)
    sent = users(page)[0]
    for part in ("[page 2]", "Hotel Lune.", "MARKER-4410", "MARKER-8812 soup first.", "day | dish"):
        assert part in sent, (part, sent)
    wait_reply(page, app, "reply about the documents", tokens=None)


def test_attached_files_can_be_removed_and_stay_with_their_chat_when_another_is_shown(
    page, app, tmp_path
):
    """An attached file had no ✕, and it stayed attached when another chat was shown (it went
    with that chat's next message); then it was dropped with a warning. It stays with its chat's
    draft: another chat shows none, and it is back when its chat is shown again."""
    new_chat(page, temperature=0, max_tokens=4)
    notes = tmp_path / "pantry-notes.txt"
    notes.write_text("MARKER-5120: the pantry is empty.\n", encoding="utf-8")
    remove = page.locator("#remove-attachments-btn")
    assert not remove.is_visible(), "✕ shows with nothing attached"
    attach_file(page, notes)
    assert wait_until(
        lambda: "pantry-notes.txt" in attached_line(page) and remove.is_visible(), 30
    ), attached_line(page)
    shot(page, "08-attached-with-remove")
    remove.click()
    assert wait_until(lambda: attached_line(page).strip() == "" and not remove.is_visible(), 10), (
        attached_line(page)
    )
    send(page, "Say hi.")
    assert wait_until(lambda: len(users(page)) == 1, 30), users(page)
    assert "MARKER-5120" not in users(page)[0], "a removed file went with the message"
    wait_reply(page, app, "reply to a message without the removed file", tokens=None)
    attach_file(page, notes)
    assert wait_until(lambda: "pantry-notes.txt" in attached_line(page), 30), attached_line(page)
    title = sidebar(page)[0].split(" · ")[0]
    open_new_chat(page)
    assert wait_until(lambda: attached_line(page).strip() == "" and not remove.is_visible(), 10), (
        attached_line(page)
    )
    select_chat(page, title)
    assert wait_until(
        lambda: "pantry-notes.txt" in attached_line(page) and remove.is_visible(), 10
    ), attached_line(page)
    assert page.locator(".toast-body.warning").count() == 0, (
        f"a warning when the chat was shown again: {toasts(page)}"
    )


# ---- 9. stop strings and seeds


def test_stop_string_ends_the_reply_before_it(page, app):
    open_new_chat(page)
    open_settings(page)
    # a new chat starts from the settings of the chat shown (an imported chat's system prompt among
    # them): no system prompt here. (The page's default penalty, above 1, is
    # test_the_pages_repetition_penalty_is_a_chat_setting_that_reaches_the_engine's.)
    # counting repeats itself: the chat's penalty set to 1 (off), which the reply shows it used
    set_settings(
        page, system_prompt="", temperature=0, max_tokens=40, stop="5", repetition_penalty=1
    )
    send(page, "Count from 1 to 10.")
    wait_reply(page, app, "reply with a stop string")
    reply = replies(page)[-1]
    line = last_line(page)
    shot(page, "09-stop-string")
    assert reply and "5" not in reply, f"the reply went past the stop string: {reply!r}"
    assert "4" in reply, f"the reply should count up to 4 before the stop string: {reply!r}"
    assert "hit the token limit" not in line and "stopped" not in line, line
    toggle = page.locator(LINE).last.locator(".title button")
    assert toggle.get_attribute("aria-label") == "Show details", toggle.evaluate(
        "b => b.outerHTML"
    )  # named for a screen reader
    page.locator(LINE).last.locator(".title").click()  # open the stats line: how the reply ended
    assert wait_until(lambda: "finished" in page.locator(LINE).last.inner_text(), 5), page.locator(
        LINE
    ).last.inner_text()
    assert wait_until(lambda: toggle.get_attribute("aria-label") == "Hide details", 5), (
        toggle.get_attribute("aria-label")
    )
    assert page.locator(LINE).last.locator(".title").get_attribute("aria-expanded") == "true"


def test_a_seed_gives_the_same_sampled_reply_every_time(page, app):
    # repetition penalty 1: the first reply (its prompt computed whole) and its regenerations
    # (the prompt read from the prefix cache) then differed ("The world of Arctomix is" against
    # "The world of small planets and the universe"), when a seeded draw was an inverse CDF that
    # the ~1e-3 arithmetic difference of a cached prompt moved in the vocabulary's long tail
    new_chat(page, temperature=1, max_tokens=8, seed=1234, stop="", repetition_penalty=1)
    send(page, "Invent a name for a new planet.")
    wait_reply(page, app, "seeded reply")
    for n in (2, 3):
        retry(page)
        wait_reply(
            page,
            app,
            f"seeded reply, version {n}",
            version=f"version {n}/3" if n == 3 else "version 2/2",
        )
    texts = {3: replies(page)[-1]}
    for n in (2, 1):
        prev_version(page)
        assert wait_until(lambda: f"Reply 1: version {n} of 3" in versions_label(page), 20), (
            versions_label(page)
        )
        time.sleep(0.3)
        texts[n] = replies(page)[-1]
    shot(page, "09-seeded")
    assert texts[1] and texts[1] == texts[2] == texts[3], (
        f"the same seed gave different replies: {texts}"
    )
