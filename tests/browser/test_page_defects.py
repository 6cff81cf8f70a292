"""Defects new users found on the chat page (issue 45, round 3, and the walkthrough of
2026-12-05), each as a person meets it in Debian's Chromium (Playwright), against the app that
the browser tests share (conftest.py's ``chat_app``)."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import unquote

import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    BROWSER_MARKS,
    REPLY,
    USER,
    browser,
    engine_idle,
    wait_page_loaded,
)
from server_utils import wait_until

from minisgl_app.chat.store import ChatSettings, ConversationStore, MessageStats

pytestmark = BROWSER_MARKS


@pytest.fixture
def app(chat_app):
    return chat_app


@pytest.fixture
def context(browser, app):
    """A browser context (its tabs share the page's cookie), closed after the test."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    yield ctx
    ctx.close()
    wait_until(lambda: engine_idle(app), 15)


def open_tab(context, app, chat_id: int | None = None):
    page = context.new_page()
    url = app.page_url + (f"&chat={chat_id}" if chat_id is not None else "")
    page.goto(url)
    wait_page_loaded(page)
    return page


def stored_chat(app, title: str) -> int:
    """A chat with one question and its answer, written to the app's database."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title=title)
        store.append(conv.id, "user", f"{title}: say hi.")
        store.append(conv.id, "assistant", "Hi.")
        return conv.id


def stored_settings(app, chat_id: int):
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        return store.get(chat_id).settings


def toasts(page) -> list[str]:
    return page.locator(".toast-body").all_inner_texts()


def close_toasts(page) -> None:
    for button in page.locator(".toast-close").all():
        button.click()


def open_settings(page) -> None:
    if not page.locator("#max-tokens input").is_visible():
        page.get_by_text("Settings", exact=True).first.click()
        page.locator("#max-tokens input").wait_for(state="visible", timeout=5_000)


# ---- A. a refused setting is never saved, not even clamped into its range


# one value per slider, above the range for two and below it for one (each case costs ~6 s)
SLIDER_VALUES_OUT_OF_RANGE = [
    ("#top-p input[type=number]", "top_p", "7"),
    ("#temperature input[type=number]", "temperature", "-5"),
    ("#repetition-penalty input[type=number]", "repetition_penalty", "3"),
]


def test_a_slider_value_out_of_range_is_refused_and_its_clamp_never_saved(context, app):
    """Typed into a slider's number box and left with Tab, a value out of the slider's range was
    refused in a toast, yet the database then held the slider's end (top-p 7 → 1.0): Gradio's
    slider sends the typed value on blur and then clamps its box to the range, and that clamped
    value went to the server with the next event that read the form. Two tabs on the chat, as
    the walkthrough had them."""
    chat_id = stored_chat(app, "Clamped Okapi")
    page = open_tab(context, app, chat_id)
    other = open_tab(context, app, chat_id)
    open_settings(page)
    open_settings(other)
    before = stored_settings(app, chat_id)
    for selector, field, typed in SLIDER_VALUES_OUT_OF_RANGE:
        close_toasts(page)
        shown = page.input_value(selector)
        box = page.locator(selector)
        box.click()
        box.press("Control+a")
        box.press_sequentially(typed, delay=20)
        box.press("Tab")
        assert wait_until(lambda: any("not saved" in t for t in toasts(page)), 10), (
            f"{typed} in {selector}: no refusal: {toasts(page)}"
        )
        assert wait_until(lambda: page.input_value(selector) == shown, 5), (
            f"{typed} in {selector}: the box shows {page.input_value(selector)!r}, not {shown!r}"
        )
        time.sleep(1.5)  # the tick of both tabs, and any event the blur set off
        now = stored_settings(app, chat_id)
        assert getattr(now, field) == getattr(before, field), (
            f"{typed} in {selector} was refused, but {field} was saved as {getattr(now, field)}"
        )
    page.reload()
    wait_page_loaded(page)
    open_settings(page)
    assert stored_settings(app, chat_id) == before
    for selector, field, _ in SLIDER_VALUES_OUT_OF_RANGE:
        assert float(page.input_value(selector)) == getattr(before, field), selector


# ---- B. a slider's ↺ gives the default of a new chat


def put_slider(page, selector: str, value: str) -> None:
    """Type ``value`` into a slider's number box and leave it (saved), as a person does."""
    box = page.locator(selector)
    box.click()
    box.press("Control+a")
    box.press_sequentially(value, delay=20)
    box.press("Tab")


def test_a_sliders_reset_button_gives_the_default_of_a_new_chat(context, app):
    """↺ beside a slider put back the value the page loaded with (a chat at temperature 1.2, set
    to 0.5: ↺ gave 1.2 and saved it), not the default a new chat starts with."""
    defaults = ChatSettings()
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Reset Ibex", settings=ChatSettings(temperature=1.2, top_p=0.5))
        chat_id = conv.id
    page = open_tab(context, app, chat_id)
    open_settings(page)
    for name, field, typed in (
        ("temperature", "temperature", "0.5"),
        ("top-p", "top_p", "0.7"),
        ("repetition-penalty", "repetition_penalty", "1.5"),
    ):
        put_slider(page, f"#{name} input[type=number]", typed)
        assert wait_until(lambda: getattr(stored_settings(app, chat_id), field) == float(typed), 10)
        page.click(f"#{name} button[data-testid=reset-button]")
        default = getattr(defaults, field)
        assert wait_until(lambda: getattr(stored_settings(app, chat_id), field) == default, 10), (
            f"↺ of {name}: {field} is {getattr(stored_settings(app, chat_id), field)}, not the default {default}"
        )
        assert float(page.input_value(f"#{name} input[type=number]")) == default
    page.reload()
    wait_page_loaded(page)
    open_settings(page)
    assert float(page.input_value("#temperature input[type=number]")) == defaults.temperature


# ---- C (and issue 45, item 8). a page that cannot reach the app says so


UNREACHABLE = "#unreachable-note"


def test_a_page_that_cannot_reach_the_app_says_so_and_clears_it_once_answered(context, app):
    """A tab whose requests wait unanswered (the browser's six connections to the app taken by
    other tabs of it, or the app stopped) kept its last status line ("Ready · 0 running") or
    "Connecting…", and Enter did nothing and said nothing. It says it cannot reach the app, and
    takes the note back once the app answers again."""
    page = open_tab(context, app)
    assert not page.locator(UNREACHABLE).is_visible()
    held = []
    page.route("**/gradio_api/queue/join*", lambda route: held.append(route))  # never answered
    page.locator(UNREACHABLE).wait_for(state="visible", timeout=30_000)
    assert "cannot reach the app" in page.inner_text(UNREACHABLE)
    page.unroute("**/gradio_api/queue/join*")  # the requests held go on (Playwright continues them)
    page.locator(UNREACHABLE).wait_for(state="hidden", timeout=30_000)


# ---- the web app manifest a logged-in page asks for


def test_a_logged_in_page_gets_its_web_app_manifest(context, app):
    """The browser fetches the page's web app manifest without cookies (a manifest link is not
    sent with credentials), so the page key's check refused it: "Manifest fetch from
    /manifest.json failed, code 401" in the console at every load of a headed Chromium. Headless
    Chromium fetches it when asked (DevTools' Page.getAppManifest, as the browser does)."""
    page = open_tab(context, app)
    refused = []
    page.on("response", lambda r: r.status >= 400 and refused.append(f"{r.status} {r.url}"))
    cdp = context.new_cdp_session(page)
    manifest = cdp.send("Page.getAppManifest")
    assert not manifest.get("errors") and '"name"' in manifest.get("data", ""), manifest
    assert not [x for x in refused if "manifest" in x], refused


# ---- the import chooser


def test_the_import_chooser_offers_json_files(context, app):
    """Import's file chooser offered every file (accept=""): it now lists JSON files first (a
    file of another type can still be picked there, and is refused with a sentence)."""
    page = open_tab(context, app)
    if not page.locator("#import-btn").is_visible():
        page.get_by_text("Manage", exact=True).first.click()
        page.locator("#import-btn").wait_for(state="visible", timeout=5_000)
    with page.expect_file_chooser() as chooser:
        page.click("#import-btn")
    accept = chooser.value.element.get_attribute("accept") or ""
    assert ".json" in accept.split(","), accept


# ---- the Markdown export


def test_the_markdown_export_keeps_a_messages_line_breaks(context, app):
    """A message's lines, one under the other on the page, were exported as lines joined by a
    single newline: a Markdown viewer runs them into one paragraph. Each keeps its break (two
    spaces at its end), and a code block is left as it was."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Lines Tapir")
        store.append(conv.id, "user", "Tapir line one\nTapir line two")
        store.append(conv.id, "assistant", "Sure:\n```\ncode one\ncode two\n```\nDone.")
        chat_id = conv.id
    page = open_tab(context, app, chat_id)
    if not page.locator("#export-md-btn").is_visible():
        page.get_by_text("Manage", exact=True).first.click()
        page.locator("#export-md-btn").wait_for(state="visible", timeout=5_000)
    with page.expect_download(timeout=10_000) as info:
        page.click("#export-md-btn")
    app.files_seen.append(
        next(
            p
            for p in Path(unquote(info.value.url.split("file=", 1)[1])).parents
            if p.name.startswith("minisgl-chat-files-")
        )
    )
    md = Path(info.value.path()).read_text()
    assert "Tapir line one  \nTapir line two\n" in md, md
    assert "Sure:  \n```\ncode one\ncode two\n```\nDone." in md, md


# ---- Delete message while the chat replies


LONG_PROMPT = "Write a very long story about a dragon who learns to cook. Use many chapters."


def test_delete_message_while_the_chat_replies_is_refused_without_asking_first(context, app):
    """Delete message while the chat replied asked "Delete this message …?" and, once confirmed,
    refused ("This chat is replying"): it refuses at once, without the question."""
    page = open_tab(context, app)
    page.fill("#msg-input textarea", LONG_PROMPT)
    page.press("#msg-input textarea", "Enter")
    page.locator("#stop-btn.stop").wait_for(timeout=30_000)  # Stop has a reply to stop
    page.locator("#chatbot [data-testid='user']").first.click()  # the versions bar acts on it
    page.locator("#delete-message-btn").wait_for(state="visible", timeout=10_000)
    questions = []
    page.on("dialog", lambda d: (questions.append(d.message), d.accept()))
    page.click("#delete-message-btn")
    assert wait_until(lambda: any("replying" in t for t in toasts(page)), 10), toasts(page)
    assert not questions, questions
    page.click("#stop-btn")


# ---- Stop is pressable only while there is a reply to stop


def test_stop_is_disabled_while_nothing_replies(context, app):
    """Stop was pressable with nothing to stop (only grey instead of red). It is disabled while
    the chat shown is idle, pressable from Enter (a Stop pressed before the reply is drawn still
    stops it) and while the reply runs, and disabled again once it has stopped."""
    page = open_tab(context, app)
    stop = page.locator("#stop-btn")
    assert stop.is_disabled(), "Stop is pressable in a new chat"
    page.fill("#msg-input textarea", LONG_PROMPT)
    page.press("#msg-input textarea", "Enter")
    assert stop.is_enabled(), "Stop is disabled just after Enter"
    page.locator("#stop-btn.stop").wait_for(timeout=30_000)
    assert stop.is_enabled()
    stop.click()
    assert wait_until(lambda: stop.is_disabled(), 10), "Stop is pressable after the reply stopped"
    assert wait_until(lambda: engine_idle(app), 10), app.metrics()


# ---- numbered lines show their numbers as written


NUMBERS_SHOWN_JS = """bubble => [...bubble.querySelectorAll('ol > li')].map(li => {
    const ol = li.parentElement; return ol.start + [...ol.children].indexOf(li); })"""


def test_numbered_lines_show_the_numbers_written(context, app):
    """A reply whose lines were numbered "1. 2. 249. 250." showed "1. 2. 3. 4.": Markdown numbers
    a list's items from its first. Each numbered line shows its own number, in a message of the
    user's and in a reply, and nothing of how that is done shows or is copied."""
    text = "Lines kept:\n\n1. one\n2. two\n249. Wapiti\n250. Wapiti again"
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Numbered Wapiti")
        store.append(conv.id, "user", text)
        store.append(conv.id, "assistant", text)
    page = open_tab(context, app, conv.id)
    for bubble in (page.locator(USER).first, page.locator(REPLY).first):
        bubble.wait_for()
        assert bubble.evaluate(NUMBERS_SHOWN_JS) == [1, 2, 249, 250], bubble.inner_html()
        assert "<!" not in bubble.inner_text() and "Wapiti again" in bubble.inner_text()
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("navigator.clipboard.writeText('')")
    page.locator(REPLY).first.hover()
    page.locator("#chatbot .message-buttons-left button[aria-label='Copy message']").first.click()
    assert wait_until(lambda: page.evaluate("navigator.clipboard.readText()"), 5)
    assert page.evaluate("navigator.clipboard.readText()") == text


# ---- a message is one Tab stop; its actions are reached with the arrow keys


FOCUSED = """() => { const e = document.activeElement;
    return e.dataset.testid || e.getAttribute('aria-label') || e.id || e.tagName; }"""


def test_a_reply_is_one_tab_stop_and_its_actions_follow_with_the_arrow_keys(context, app):
    """Each reply took five Tab stops (itself, Copy, Edit, its figures' ▸, ↻). A message is one:
    Tab goes from one to the next; → and ← go through its actions, Enter uses one; ↑ ↓ go to
    the message before and after."""
    with ConversationStore(app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title="Keyed Wapiti")
        for turn in (1, 2):
            store.append(conv.id, "user", f"Keyed Wapiti question {turn}")
            stats = MessageStats(ttft_ms=100.0, tok_s=10.0, tokens=5, finish_reason="stop")
            store.append(conv.id, "assistant", f"Keyed Wapiti answer {turn}", stats=stats)
    page = open_tab(context, app, conv.id)
    page.locator(REPLY).nth(1).wait_for()
    page.locator(USER).first.focus()
    stops = []
    for _ in range(3):
        page.keyboard.press("Tab")
        stops.append(page.evaluate(FOCUSED))
    assert stops == ["bot", "user", "bot"], stops
    actions = []
    for _ in range(6):
        page.keyboard.press("ArrowRight")
        actions.append(page.evaluate(FOCUSED))
    assert {"Copy message", "Edit", "Retry", "Show details"} <= set(actions), actions
    while page.evaluate(FOCUSED) != "Show details":
        page.keyboard.press("ArrowLeft")
    page.keyboard.press("Enter")
    assert wait_until(lambda: page.evaluate(FOCUSED) == "Hide details", 5), page.evaluate(FOCUSED)
    page.keyboard.press("Home")
    assert page.evaluate(FOCUSED) == "bot"
    page.keyboard.press("ArrowUp")
    assert page.evaluate("() => document.activeElement.innerText") == "Keyed Wapiti question 2"


# ---- a reload keeps the chat shown in the address


ADDRESSES_JS = """() => {
  window.addressesSet = [];
  const replace = history.replaceState.bind(history);
  history.replaceState = (state, title, url) => { window.addressesSet.push(String(url)); replace(state, title, url); };
}"""


def test_a_reload_never_names_a_new_chat_while_showing_a_stored_one(context, app):
    """After a reload the address read /?chat=new while the page showed chat 1: the load's last
    step wrote the chat list's value into the address before the list had been drawn (none yet:
    a new chat), and forgot the chat in the browser's storage. Through a reload the address
    names only the chat shown."""
    chat_id = stored_chat(app, "Reloaded Wapiti")
    page = context.new_page()
    page.add_init_script(f"({ADDRESSES_JS})()")
    page.goto(app.page_url + f"&chat={chat_id}")
    wait_page_loaded(page)
    page.reload()
    wait_page_loaded(page)
    assert wait_until(lambda: "Reloaded Wapiti" in page.inner_text("#chatbot"), 10)
    assert wait_until(lambda: f"chat={chat_id}" in page.url, 5), page.url
    set_since = page.evaluate("window.addressesSet")
    assert not [a for a in set_since if "chat=new" in a], set_since
    assert page.evaluate("localStorage.getItem('minisgl-chat:shown')") == str(chat_id)
