"""A chat longer than the model's context, in Debian's Chromium against the real app (demo model,
8,192 tokens of context; issue 45, item 2): under the default policy the chat goes on, its oldest
turns left out and marked, and the reply answers the last message; under "stop" the page says so
(no assistant error reply) and ↻ answers with the oldest turns dropped; the meter under the box
shows the server's own count of the next prompt.

The long chats are imported (no prefill of them on a 2-core machine): two messages of ~36,000
characters (~8,000 tokens each), so the model reads only the last question and answers fast."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from chat_page_utils import (  # noqa: F401 (browser: fixture)
    ARTIFACTS,
    BROWSER_MARKS,
    LINE,
    REPLY,
    USER,
    attach_file,
    attached_line,
    browser,
    open_chat_list,
    open_new_chat,
    pick_import_file,
    put_setting,
    send,
    wait_page_loaded,
)
from server_utils import wait_until

from minisgl_app.chat.store import ChatSettings
from minisgl_app.chat.view import BEYOND_CONTEXT_LINE, OVER_CONTEXT_LINE
from minisgl_engine.weights.demo import DEMO_MODEL_NAME

pytestmark = BROWSER_MARKS

QUESTION = "What is the capital of France?"
ANY_ROW = "#chatbot .message-row"
REPLY_WAIT_S = 180  # a loaded 2-core machine is slow
LONG = "the quick brown fox jumps over the lazy dog. " * 800  # ~36,000 characters


@pytest.fixture
def app(chat_app):
    return chat_app


@pytest.fixture
def page(browser, app):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    tab.goto(app.page_url)
    wait_page_loaded(tab, "Ready", 180)
    yield tab
    context.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"context-{name}.png"), full_page=True)


def replies(page) -> list[str]:
    return [t.strip() for t in page.locator(REPLY).all_inner_texts()]


def users(page) -> list[str]:
    return [t.strip() for t in page.locator(USER).all_inner_texts()]


def lines(page) -> list[str]:
    return [t.strip() for t in page.locator(LINE).all_inner_texts()]


def toasts(page) -> str:
    return " | ".join(page.locator(".toast-body").all_inner_texts())


def meter(page) -> str:
    return page.inner_text("#context-meter").strip()


def import_chat(page, path: Path, messages: list[dict]) -> None:
    """Import an OpenAI-style chat file; the page shows it."""
    path.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    pick_import_file(page, path)
    asked = [m["content"] for m in messages if m["role"] == "user"]

    def shown() -> bool:  # this chat, not the one shown before with as many questions
        texts = users(page)
        return len(texts) == len(asked) and asked[0][:30] in texts[0]

    assert wait_until(shown, 60), users(page)


def long_chat(tag: str) -> list[dict]:
    return [
        {"role": "user", "content": f"{tag} part one: {LONG}"},
        {"role": "assistant", "content": "Noted, part one."},
        {"role": "user", "content": f"{tag} part two: {LONG}"},
        {"role": "assistant", "content": "Noted, part two."},
    ]


def greedy(page) -> None:
    """Temperature 0 for the chat shown (saved when the box is left)."""
    if not page.locator("#max-tokens input").is_visible():
        page.click("#settings >> text=Settings")
        page.wait_for_selector("#max-tokens input", state="visible")
    put_setting(page, "#temperature input[type=number]", "0")
    time.sleep(1.0)  # the save is sent; nothing on the page confirms it


def reply_done(page) -> bool:
    found = lines(page)
    return bool(found) and "replying" not in found[-1] and bool(re.search(r"\d+ tokens", found[-1]))


def wait_reply(page, what: str) -> None:
    ok = wait_until(lambda: reply_done(page), REPLY_WAIT_S, interval=0.3)
    if not ok:
        shot(page, f"timeout-{what}")
    assert ok, f"{what}: no reply; lines: {lines(page)}; toasts: {toasts(page)}"


def server_prompt_tokens(app, messages: list[dict]) -> int:
    """The server's count of a prompt: usage.prompt_tokens of a one-token reply."""
    r = httpx.post(
        f"{app.url}/v1/chat/completions",
        json={"model": DEMO_MODEL_NAME, "messages": messages, "max_tokens": 1},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def meter_tokens(page) -> int | None:
    found = re.match(r"⚠?\s*([\d,]+) / 8,192 tokens", meter(page))
    return int(found.group(1).replace(",", "")) if found else None


def test_a_chat_past_the_context_goes_on_and_the_reply_answers_the_last_message(
    page, app, tmp_path
):
    import_chat(page, tmp_path / "long.json", long_chat("Default"))
    greedy(page)
    send(page, QUESTION)
    wait_reply(page, "default policy")
    shot(page, "default-policy")
    assert "Paris" in replies(page)[-1], replies(page)
    assert BEYOND_CONTEXT_LINE in lines(page), lines(page)
    assert "⚠" not in " ".join(replies(page)), "an error reply"
    # the long messages are still in the chat, above the line
    assert len(users(page)) == 3 and users(page)[0].startswith("Default part one")


def test_the_stop_policy_says_so_and_one_click_answers_without_the_oldest_turns(
    page, app, tmp_path
):
    import_chat(page, tmp_path / "long-stop.json", long_chat("Stopping"))
    greedy(page)
    page.click("#context-policy label:has-text('Stop and say so')")
    time.sleep(1.0)  # the pick is saved (an input event)
    send(page, QUESTION)
    assert wait_until(lambda: "Not sent: the chat is" in toasts(page), 60), toasts(page)
    assert wait_until(lambda: OVER_CONTEXT_LINE in lines(page), 30), lines(page)
    shot(page, "stop-policy")
    assert replies(page) == ["Noted, part one.", "Noted, part two."], "an assistant error reply"
    # ↻ under the line: one click answers it with the oldest turns left out
    last = page.locator(ANY_ROW).last
    last.hover()
    last.locator("xpath=following-sibling::div[contains(@class, 'message-buttons')][1]").locator(
        "button[aria-label='Retry']"
    ).click()
    wait_reply(page, "after ↻")
    assert "Paris" in replies(page)[-1], replies(page)
    assert BEYOND_CONTEXT_LINE in lines(page) and OVER_CONTEXT_LINE not in lines(page)


def test_the_meter_shows_the_servers_count_of_the_next_prompt(page, app, tmp_path):
    short = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "An apple."},
        {"role": "user", "content": "And a vegetable? 🥕"},
        {"role": "assistant", "content": "A carrot."},
    ]
    import_chat(page, tmp_path / "short.json", short)
    page.fill("#msg-input textarea", QUESTION)
    expected = server_prompt_tokens(app, [*short, {"role": "user", "content": QUESTION}])
    assert wait_until(lambda: meter(page).startswith(f"{expected:,} / 8,192 tokens"), 90), (
        meter(page),
        expected,
    )
    # past the context: the meter counts what the model would read (the oldest turns left out)
    import_chat(page, tmp_path / "long-meter.json", long_chat("Metered"))
    page.fill("#msg-input textarea", QUESTION)
    expected = server_prompt_tokens(app, [{"role": "user", "content": QUESTION}])
    # (the line for the empty box says "left out" too: wait for the count of the typed question)
    assert wait_until(lambda: meter_tokens(page) == expected, 90), (meter(page), expected)
    assert "oldest 4 left out" in meter(page), meter(page)


def test_a_file_too_long_for_the_context_is_said_so_and_its_first_part_sent(page, app, tmp_path):
    long_file = tmp_path / "long-notes.txt"
    long_file.write_text(LONG * 3, encoding="utf-8")  # ~24,000 tokens, three times the context
    open_new_chat(page)
    greedy(page)
    put_setting(page, "#max-tokens input", "16")  # 16 tokens kept for the reply
    time.sleep(1.0)
    try:
        attach_file(page, long_file)
        assert wait_until(lambda: long_file.name in attached_line(page), 30)
        send(page, "What is this file about?")
        notice = page.locator("#too-long-text")
        assert wait_until(notice.is_visible, 60), toasts(page)
        found = re.search(
            r"long-notes.txt is ([\d,]+) tokens, too long for the model: ([\d,]+) of them fit",
            notice.inner_text(),
        )
        shot(page, "file-too-long")
        assert found, notice.inner_text()
        file_tokens, fitting = (int(g.replace(",", "")) for g in found.groups())
        assert file_tokens > 3 * 8192 * 0.9 and 7000 < fitting < 8192 - 16, (file_tokens, fitting)
        assert users(page) == [], "nothing was sent"
        assert page.input_value("#msg-input textarea") == "What is this file about?"
        # Cancel: nothing sent, the file stays attached; Send again asks again
        page.click("#cancel-too-long-btn")
        assert wait_until(lambda: not notice.is_visible(), 30)
        assert "long-notes.txt" in attached_line(page) and users(page) == []
        page.click("#send-btn")
        assert wait_until(notice.is_visible, 60)
        before = app.metrics()["minisgl_prompt_tokens_total"]
        page.click("#send-first-part-btn")
        wait_reply(page, "the first part")
        sent = app.metrics()["minisgl_prompt_tokens_total"] - before
        assert 8192 - 16 - 100 < sent <= 8192 - 16, f"the prompt fits the context: {sent}"
        assert "long-notes.txt (the first part)" in users(page)[0], users(page)[0][:200]
        assert "⚠" not in " ".join(replies(page)), "an error reply"
        assert not notice.is_visible() and attached_line(page).strip() == ""
    finally:  # the next tabs open this chat, and new chats start from its settings
        put_setting(page, "#max-tokens input", str(ChatSettings().max_tokens))
