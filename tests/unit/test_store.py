"""The conversation store: what the chat UI relies on when it saves, lists, branches, imports,
searches, exports and reloads."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from minisgl_app.chat.store import (
    DB_NAME,
    DEFAULT_TITLE,
    SCHEMA_VERSION,
    TITLE_LENGTH,
    BadImportFile,
    ChatSettings,
    ConversationStore,
    MessageStats,
    NotFoundError,
    SchemaTooNewError,
    default_settings,
    title_from,
)


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("MINISGL_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def store(data_dir):
    with ConversationStore() as s:
        yield s


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ----------------------------------------------------------------------------- basics


def test_create_append_get_returns_messages_in_order(store):
    settings = ChatSettings(system_prompt="Be brief.", temperature=0.2, max_tokens=64)
    conv = store.create("Paris", settings)
    assert (conv.title, conv.settings, conv.messages) == ("Paris", settings, [])
    store.append(conv.id, "user", "What is the capital of France?")
    store.append(
        conv.id,
        "assistant",
        "Paris.",
        MessageStats(ttft_ms=12.5, tok_s=80.0, tokens=3, finish_reason="stop"),
    )
    got = store.get(conv.id)
    assert [(m.position, m.role, m.content) for m in got.messages] == [
        (0, "user", "What is the capital of France?"),
        (1, "assistant", "Paris."),
    ]
    assert got.messages[0].stats is None
    assert got.messages[1].stats == MessageStats(12.5, 80.0, 3, "stop", False)
    assert got.settings == settings


def test_create_defaults(store):
    conv = store.create()
    assert conv.title == DEFAULT_TITLE
    assert conv.settings == default_settings() == store.default_settings() == ChatSettings()


def test_stats_may_be_given_as_a_dict_and_come_back_as_message_stats(store):
    conv = store.create()
    reply = store.append(conv.id, "assistant", "", stats={"tokens": 0})
    assert reply.stats == MessageStats(tokens=0)
    store.update_message(
        reply.id,
        "done",
        {"ttft_ms": 5.0, "tok_s": 9.5, "tokens": 3, "finish_reason": "stop", "stopped": False},
    )
    assert store.get(conv.id).messages[0].stats == MessageStats(5.0, 9.5, 3, "stop", False)
    with pytest.raises(TypeError):
        store.update_message(reply.id, "x", {"tokns": 3})


def test_streamed_reply_is_created_once_and_updated_until_stopped(store):
    conv = store.create()
    store.append(conv.id, "user", "Count to ten.")
    reply = store.append(conv.id, "assistant", "")
    for shown in ["1", "1 2", "1 2 3"]:
        store.update_message(reply.id, shown)
    store.update_message(
        reply.id, "1 2 3 4", MessageStats(tokens=7, finish_reason="abort", stopped=True)
    )
    store.update_message(reply.id, "1 2 3 4")  # stats=None keeps the stored stats
    [_, saved] = store.get(conv.id).messages
    assert (saved.id, saved.content) == (reply.id, "1 2 3 4")
    assert saved.stats.stopped and saved.stats.tokens == 7


def test_rename_and_update_settings(store):
    conv = store.create()
    store.rename(conv.id, "  Trip   to Paris ")
    store.update_settings(conv.id, ChatSettings(temperature=0.0, thinking=True))
    got = store.get(conv.id)
    assert got.title == "Trip to Paris"
    assert got.settings == ChatSettings(temperature=0.0, thinking=True)
    with pytest.raises(ValueError, match="empty"):
        store.rename(conv.id, "   ")


def test_invalid_settings_are_not_stored(store):
    conv = store.create(settings=ChatSettings(top_p=0.5))
    with pytest.raises(ValueError, match="temperature"):
        store.update_settings(conv.id, ChatSettings(temperature=5))
    assert store.get(conv.id).settings == ChatSettings(top_p=0.5)
    with pytest.raises(ValueError, match="max tokens"):
        store.create(settings=ChatSettings(max_tokens=0))
    assert len(store.list()) == 1


def test_missing_ids_raise_not_found(store):
    conv = store.create()
    store.delete(conv.id)
    for call in (
        lambda: store.get(conv.id),
        lambda: store.append(conv.id, "user", "hi"),
        lambda: store.rename(conv.id, "x"),
        lambda: store.delete(conv.id),
        lambda: store.truncate_after(conv.id, 0),
        lambda: store.update_message(999, "x"),
        lambda: store.update_settings(conv.id, ChatSettings()),
        lambda: store.export_json(conv.id),
    ):
        with pytest.raises(NotFoundError) as err:
            call()
        assert isinstance(err.value, KeyError) and "no " in str(err.value)


def test_append_refuses_an_unknown_role(store):
    conv = store.create()
    with pytest.raises(ValueError, match="role"):
        store.append(conv.id, "tool", "x")
    assert store.get(conv.id).messages == []


def test_list_puts_the_most_recently_updated_first(store):
    a, b, c = (store.create(t) for t in "abc")
    assert [s.title for s in store.list()] == ["c", "b", "a"]
    store.append(a.id, "user", "hello")
    assert [s.title for s in store.list()] == ["a", "c", "b"]
    store.truncate_after(
        b.id, -1
    )  # a write to the chat's messages, even one that drops them, uses it
    assert [s.title for s in store.list()] == ["b", "a", "c"]
    store.delete(c.id)
    assert [s.id for s in store.list()] == [b.id, a.id]


def test_renaming_or_changing_settings_leaves_the_chat_in_its_place_and_time(store):
    """Renaming a chat is not using it (a tour saw a renamed chat jump from under the pointer to
    the top of the list): the order and the time shown stay, while the revision that other
    tabs follow still moves."""
    a, b, c = (store.create(t) for t in "abc")
    before = {s.id: s.updated_at for s in store.list()}
    revision = store.revision(b.id)
    store.rename(b.id, "b2")
    store.update_settings(b.id, ChatSettings(temperature=0.5))
    listed = store.list()
    assert [s.title for s in listed] == ["c", "b2", "a"]
    assert {s.id: s.updated_at for s in listed} == before
    assert store.revision(b.id) > revision and store.get(b.id).settings.temperature == 0.5


def test_truncate_after_drops_later_messages_and_positions_continue(store):
    conv = store.create()
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        store.append(conv.id, role, f"m{i}")
    store.truncate_after(conv.id, 2)  # regenerate: keep the last user message
    assert [m.content for m in store.get(conv.id).messages] == ["m0", "m1", "m2"]
    store.truncate_after(conv.id, 1)  # edit-and-resend: drop it too, then append the edit
    new = store.append(conv.id, "user", "m2 edited")
    assert (new.position, [m.content for m in store.get(conv.id).messages]) == (
        2,
        ["m0", "m1", "m2 edited"],
    )
    store.truncate_after(conv.id, -1)
    assert store.get(conv.id).messages == []


def test_delete_cascades_to_messages(store):
    keep, gone = store.create("keep"), store.create("gone")
    store.append(keep.id, "user", "stay")
    store.append(gone.id, "user", "go")
    store.append(gone.id, "assistant", "went")
    store.delete(gone.id)
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT conversation_id, content FROM messages").fetchall() == [
            (keep.id, "stay")
        ]


# ----------------------------------------------------------------------------- trees


def shown(conv) -> list[tuple[str, int, int]]:
    """The shown path as (content, version index, version count)."""
    return [(m.content, m.sibling_index, m.sibling_count) for m in conv.messages]


def chat(store, *contents: str):
    """A linear chat of alternating user and assistant messages; returns (conversation, messages)."""
    conv = store.create()
    msgs = [
        store.append(conv.id, "user" if i % 2 == 0 else "assistant", c)
        for i, c in enumerate(contents)
    ]
    return conv, msgs


def test_append_grows_one_branch_below_the_selected_leaf(store):
    conv, [u, a, u2] = chat(store, "u", "a", "u2")
    assert [(m.parent_id, m.position) for m in (u, a, u2)] == [(None, 0), (u.id, 1), (a.id, 2)]
    got = store.get(conv.id)
    assert [m.id for m in got.messages] == [u.id, a.id, u2.id]
    assert shown(got) == [("u", 0, 1), ("a", 0, 1), ("u2", 0, 1)]
    assert [m.parent_id for m in got.messages] == [None, u.id, a.id]


def test_append_leaving_unanswered_marks_only_the_questions_after_the_last_reply(store):
    """append(leave_unanswered=True): the questions at the shown path's end, after its last reply,
    are marked as left unanswered (their other stats kept), in the transaction that adds the
    message; earlier questions, replies and the new message keep no mark; marking twice is marking once."""
    c = store.create().id
    answered = store.append(c, "user", "answered")
    store.append(c, "assistant", "a reply")
    first = store.append(c, "user", "first waiting", stats={"tokens": 3})
    second = store.append(c, "user", "second waiting")
    new = store.append(c, "user", "the new question", leave_unanswered=True)
    stats = {m.id: m.stats for m in store.get(c).messages}
    assert stats[first.id].unanswered and stats[first.id].tokens == 3, stats[first.id]
    assert stats[second.id].unanswered
    assert not any(
        s is not None and s.unanswered for i, s in stats.items() if i not in (first.id, second.id)
    ), stats
    assert store.get(c).messages[-1].id == new.id
    store.append(c, "assistant", "answers the new one")
    store.append(
        c, "user", "next", leave_unanswered=True
    )  # nothing waits after the last reply: nothing marked
    assert [
        m.content for m in store.get(c).messages if m.stats is not None and m.stats.unanswered
    ] == ["first waiting", "second waiting"]
    assert store.get(c).messages[0].id == answered.id
    # a new chat's first message, and the first message of a chat with none: nothing to mark
    empty = store.create().id
    store.append(empty, "user", "hello", leave_unanswered=True)
    assert store.get(empty).messages[0].stats is None


def test_marking_questions_unanswered_reads_no_messages_text(store):
    """append(leave_unanswered=True) runs on every send, inside the write lock: it read every
    message of the shown path, text included (SELECT m.*), to mark the few questions at its end.
    It reads only the ids, roles, parents and stats, walking up from the leaf through questions only."""
    from minisgl_app.chat.store import tree as tree_module

    c = store.create().id
    for i in range(5):
        store.append(c, "user", f"question {i} " + "long text " * 200)
        store.append(c, "assistant", f"reply {i}")
    waiting = [store.append(c, "user", f"waiting {i}") for i in range(2)]
    read: set[tuple[str, str]] = set()

    def authorize(action, table, column, *_):
        if action == sqlite3.SQLITE_READ and table == "messages":
            read.add((table, column))
        return sqlite3.SQLITE_OK

    with store._write() as conn:
        conn.set_authorizer(authorize)
        try:
            tree_module.mark_unanswered(conn, waiting[-1].id)
        finally:
            conn.set_authorizer(None)
    assert read and ("messages", "content") not in read, sorted(read)
    assert [
        m.content for m in store.get(c).messages if m.stats is not None and m.stats.unanswered
    ] == ["waiting 0", "waiting 1"]


def test_regenerate_adds_a_sibling_and_keeps_the_old_version(store):
    conv, [u, a1] = chat(store, "Capital of France?", "Paris.")
    a2 = store.add_message(conv.id, a1.parent_id, "assistant", "It is Paris.", {"tokens": 4})
    assert (a2.parent_id, a2.position, a2.sibling_index, a2.sibling_count) == (u.id, 1, 1, 2)
    assert shown(store.get(conv.id)) == [("Capital of France?", 0, 1), ("It is Paris.", 1, 2)]
    back = store.switch_version(conv.id, a2.id, -1)
    assert shown(back) == [("Capital of France?", 0, 1), ("Paris.", 0, 2)]
    assert back == store.get(conv.id)  # the switch is stored, not only returned
    assert shown(store.switch_version(conv.id, a1.id, -1))[-1] == ("Paris.", 0, 2)  # clamped
    assert shown(store.switch_version(conv.id, a1.id, +5))[-1] == ("It is Paris.", 1, 2)
    assert store.get(conv.id).messages[-1].stats == MessageStats(tokens=4)


def test_edit_adds_a_sibling_question_with_its_own_reply(store):
    conv, [u1, a1, u2, a2] = chat(store, "u1", "a1", "u2", "a2")
    edited = store.add_message(conv.id, u2.parent_id, "user", "u2 edited")
    store.append(conv.id, "assistant", "a2 for the edit")
    assert shown(store.get(conv.id)) == [
        ("u1", 0, 1),
        ("a1", 0, 1),
        ("u2 edited", 1, 2),
        ("a2 for the edit", 0, 1),
    ]
    # back to the original question: its reply comes back with it
    assert shown(store.switch_version(conv.id, edited.id, -1)) == [
        ("u1", 0, 1),
        ("a1", 0, 1),
        ("u2", 0, 2),
        ("a2", 0, 1),
    ]
    # a streamed reply in the other branch updates in place
    store.update_message(a2.id, "a2, longer", MessageStats(tokens=9))
    assert store.get(conv.id).messages[-1].content == "a2, longer"


def test_select_message_follows_the_branch_written_to_last(store):
    conv, [u, a1] = chat(store, "u", "a1")
    c1 = store.append(conv.id, "user", "c1")
    c2 = store.add_message(conv.id, a1.id, "user", "c2")  # the newest child of a1 ...
    g = store.add_message(
        conv.id, c1.id, "assistant", "g"
    )  # ... but c1's branch was written to last
    a2 = store.add_message(conv.id, u.id, "assistant", "a2")
    assert shown(store.get(conv.id)) == [("u", 0, 1), ("a2", 1, 2)]
    assert [m.id for m in store.select_message(conv.id, a1.id).messages] == [
        u.id,
        a1.id,
        c1.id,
        g.id,
    ]
    assert [m.id for m in store.select_message(conv.id, c2.id).messages] == [u.id, a1.id, c2.id]
    assert [m.id for m in store.switch_version(conv.id, c2.id, -1).messages] == [
        u.id,
        a1.id,
        c1.id,
        g.id,
    ]
    assert [m.id for m in store.select_message(conv.id, u.id).messages] == [u.id, a2.id]


def test_a_new_first_message_is_a_root_version(store):
    conv, [u, a] = chat(store, "first start", "reply")
    other = store.add_message(conv.id, None, "user", "second start")
    assert (other.parent_id, other.position, other.sibling_index, other.sibling_count) == (
        None,
        0,
        1,
        2,
    )
    assert shown(store.get(conv.id)) == [("second start", 1, 2)]
    assert shown(store.switch_version(conv.id, other.id, -1)) == [
        ("first start", 0, 2),
        ("reply", 0, 1),
    ]


def test_select_and_switch_do_not_reorder_the_sidebar(store):
    conv, [u, a1] = chat(store, "u", "a1")
    a2 = store.add_message(conv.id, u.id, "assistant", "a2")
    later = store.create("later")
    store.switch_version(conv.id, a2.id, -1)
    store.select_message(conv.id, a2.id)
    assert [c.id for c in store.list()] == [later.id, conv.id]


def test_streamed_updates_do_not_reorder_the_sidebar(store):
    """Two chats replying at once: their stream updates must not swap them in the sidebar."""
    first, [_, reply_1] = chat(store, "q1", "")
    second, [_, reply_2] = chat(store, "q2", "")
    for i in range(3):
        store.update_message(reply_1.id, f"part {i}")
        assert [c.id for c in store.list()] == [second.id, first.id]
        store.update_message(reply_2.id, f"part {i}", MessageStats(tokens=i))
        assert [c.id for c in store.list()] == [second.id, first.id]
    store.append(first.id, "user", "next question")  # a new turn does move it up
    assert [c.id for c in store.list()] == [first.id, second.id]


def test_delete_message_deletes_its_subtree_and_shows_another_version(store):
    conv, [u, a1, follow] = chat(store, "u", "a1", "follow-up")
    a2 = store.add_message(conv.id, u.id, "assistant", "a2")
    a3 = store.add_message(conv.id, u.id, "assistant", "a3")
    store.select_message(conv.id, a2.id)
    # the shown version goes: the previous one is shown, with its own continuation
    assert shown(store.delete_message(conv.id, a2.id)) == [
        ("u", 0, 1),
        ("a1", 0, 2),
        ("follow-up", 0, 1),
    ]
    # the first version goes: the next one is shown; its subtree went with it
    assert shown(store.delete_message(conv.id, a1.id)) == [("u", 0, 1), ("a3", 0, 1)]
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT content FROM messages ORDER BY id").fetchall() == [
            ("u",),
            ("a3",),
        ]
    # the only version goes: the path ends at its parent, and the next reply continues from there
    assert shown(store.delete_message(conv.id, a3.id)) == [("u", 0, 1)]
    assert store.append(conv.id, "assistant", "again").parent_id == u.id
    # a message off the shown path goes: nothing shown changes
    side = store.add_message(conv.id, u.id, "assistant", "side")
    store.switch_version(conv.id, side.id, -1)
    assert shown(store.delete_message(conv.id, side.id)) == [("u", 0, 1), ("again", 0, 1)]
    # the root goes: the conversation is empty and starts again with a new root
    assert store.delete_message(conv.id, u.id).messages == []
    assert store.append(conv.id, "user", "fresh").parent_id is None
    assert [c.message_count for c in store.list()] == [1]


def test_truncate_after_drops_everything_below_the_shown_message(store):
    conv, [u0, a1, u2, a3] = chat(store, "u0", "a1", "u2", "a3")
    a1b = store.add_message(conv.id, u0.id, "assistant", "a1b")
    store.append(conv.id, "user", "u2b")
    store.append(conv.id, "assistant", "a3b")
    store.truncate_after(conv.id, 2)  # regenerate in the shown branch: its last reply goes
    assert shown(store.get(conv.id)) == [("u0", 0, 1), ("a1b", 1, 2), ("u2b", 0, 1)]
    # the other branch is above position 2, so it is kept
    assert shown(store.switch_version(conv.id, a1b.id, -1)) == [
        ("u0", 0, 1),
        ("a1", 0, 2),
        ("u2", 0, 1),
        ("a3", 0, 1),
    ]
    store.truncate_after(conv.id, 0)  # below the first message: both versions of the reply go
    assert shown(store.get(conv.id)) == [("u0", 0, 1)]
    assert store.append(conv.id, "assistant", "a1c").sibling_count == 1
    store.truncate_after(conv.id, 7)  # past the end: nothing to drop
    assert len(store.get(conv.id).messages) == 2
    store.truncate_after(conv.id, -1)
    assert store.get(conv.id).messages == []
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_a_chat_deeper_than_sqlites_trigger_limit_can_be_deleted(store):
    # a cascade goes one trigger level per generation and SQLite stops at 1000
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(1500)
    ]
    conv = store.import_conversation(json.dumps(turns))
    assert conv.messages[-1].position == 1499
    store.truncate_after(conv.id, 1000)
    assert len(store.get(conv.id).messages) == 1001
    assert store.delete_message(conv.id, conv.messages[0].id).messages == []
    deep = store.import_conversation(json.dumps(turns))
    store.delete(deep.id)
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_list_counts_the_messages_shown(store):
    conv, [u, a1] = chat(store, "u", "a1")
    store.add_message(conv.id, u.id, "assistant", "a2")
    store.append(conv.id, "user", "more")
    assert store.list()[0].message_count == 3
    store.switch_version(conv.id, a1.id, 0)
    assert store.list()[0].message_count == 2


def test_tree_calls_with_missing_or_foreign_ids_raise_not_found(store):
    conv, [u, a] = chat(store, "u", "a")
    other, [x] = chat(store, "x")
    calls = [
        lambda: store.add_message(conv.id, x.id, "assistant", "wrong parent"),
        lambda: store.add_message(999, None, "user", "no conversation"),
        lambda: store.select_message(conv.id, x.id),
        lambda: store.switch_version(conv.id, 999, 1),
        lambda: store.delete_message(conv.id, x.id),
        lambda: store.delete_message(999, u.id),
    ]
    for call in calls:
        with pytest.raises(NotFoundError):
            call()
    assert shown(store.get(conv.id)) == [("u", 0, 1), ("a", 0, 1)]
    assert shown(store.get(other.id)) == [("x", 0, 1)]


def test_a_tree_survives_reopening(data_dir):
    with ConversationStore() as s:
        conv, [u, a1] = chat(s, "u", "a1")
        s.add_message(conv.id, u.id, "assistant", "a2")
        s.switch_version(conv.id, a1.id, -1)
        before = s.get(conv.id)
    with ConversationStore() as again:
        assert again.get(conv.id) == before
        assert shown(before) == [("u", 0, 1), ("a1", 0, 2)]


# ----------------------------------------------------------------------------- export


def test_export_markdown_contains_title_system_prompt_and_messages(store):
    conv = store.create("Capitals", ChatSettings(system_prompt="Answer in one word."))
    store.append(conv.id, "user", "Capital of France?")
    store.append(
        conv.id,
        "assistant",
        "```\nParis\n```",
        MessageStats(ttft_ms=30, tok_s=42.0, tokens=4, stopped=True),
    )
    md = store.export_markdown(conv.id)
    assert md.startswith("# Capitals\n")
    assert "> Answer in one word." in md
    assert "## User\n\nCapital of France?" in md
    assert "## Assistant\n\n```\nParis\n```" in md
    assert "42.0 tok/s" in md and "stopped" in md


def test_export_json_round_trips(store):
    settings = ChatSettings(
        system_prompt="Réponds en français.",
        temperature=1.3,
        top_p=0.5,
        max_tokens=2048,
        thinking=True,
    )
    conv = store.create("Deux 🐈", settings)
    store.append(conv.id, "user", "Bonjour")
    store.append(
        conv.id, "assistant", "<think>hm</think>Salut", MessageStats(tokens=5, finish_reason="stop")
    )
    doc = json.loads(store.export_json(conv.id))
    got = store.get(conv.id)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert (doc["id"], doc["title"]) == (got.id, "Deux 🐈")
    assert ChatSettings.from_dict(doc["settings"]) == settings
    assert [
        (
            m["position"],
            m["role"],
            m["content"],
            m["created_at"],
            MessageStats.from_dict(m["stats"]) if m["stats"] else None,
        )
        for m in doc["messages"]
    ] == [(m.position, m.role, m.content, m.created_at, m.stats) for m in got.messages]


# ----------------------------------------------------------------------------- import


def nothing_stored(store) -> bool:
    with sqlite3.connect(store.path) as raw:
        return (
            store.list() == [] and raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
        )


def test_import_of_our_export_round_trips_a_branched_chat(store):
    settings = ChatSettings(system_prompt="Sois bref.", temperature=1.1, top_p=0.5, thinking=True)
    conv = store.create("Branches 🌳", settings)
    u = store.append(conv.id, "user", "Bonjour")
    a1 = store.append(
        conv.id,
        "assistant",
        "Salut",
        MessageStats(ttft_ms=9.0, tok_s=50.0, tokens=2, finish_reason="stop"),
    )
    store.append(conv.id, "user", "Ça va ?")
    a2 = store.add_message(conv.id, u.id, "assistant", "Bonjour !", {"stopped": True})
    store.switch_version(conv.id, a2.id, -1)
    original = store.get(conv.id)

    copy = store.import_conversation(store.export_json(conv.id))
    assert copy.id != conv.id and store.list()[0].id == copy.id
    # beside its source, the copy is marked (test below)
    assert (copy.title, copy.settings, copy.created_at) == (
        original.title + " (imported)",
        settings,
        original.created_at,
    )

    def same(c):
        return [
            (m.role, m.content, m.created_at, m.stats, m.position, m.sibling_index, m.sibling_count)
            for m in c.messages
        ]

    assert same(copy) == same(original)  # the selected branch, a1's, is the one shown
    other = store.switch_version(copy.id, copy.messages[1].id, +1)
    assert [(m.content, m.sibling_index) for m in other.messages] == [
        ("Bonjour", 0),
        ("Bonjour !", 1),
    ]
    assert other.messages[-1].stats == MessageStats(stopped=True)
    assert len(json.loads(store.export_json(copy.id))["tree"]) == 4
    assert a1.id not in {m.id for m in copy.messages}  # new ids


def test_import_reads_exports_written_before_trees(store):
    old_export = {  # what schema 2 wrote: the messages only
        "format": "minisgl-chat conversation",
        "schema_version": 2,
        "id": 3,
        "title": "Old",
        "created_at": 100.0,
        "updated_at": 200.0,
        "settings": {
            "system_prompt": "",
            "temperature": 0.7,
            "top_p": 0.9,
            "max_tokens": 64,
            "thinking": False,
            "from_the_future": 1,
        },
        "messages": [
            {"position": 0, "role": "user", "content": "hi", "created_at": 150.0, "stats": None},
            {
                "position": 1,
                "role": "assistant",
                "content": "hello",
                "created_at": 160.0,
                "stats": {"tokens": 2, "finish_reason": "stop", "stopped": False},
            },
        ],
    }
    conv = store.import_conversation(json.dumps(old_export))
    assert (conv.title, conv.settings, conv.created_at) == (
        "Old",
        ChatSettings(temperature=0.7, max_tokens=64),
        100.0,
    )
    assert [
        (m.role, m.content, m.created_at, m.stats, m.parent_id is None) for m in conv.messages
    ] == [
        ("user", "hi", 150.0, None, True),
        ("assistant", "hello", 160.0, MessageStats(tokens=2, finish_reason="stop"), False),
    ]


def test_import_of_openai_messages(store):
    doc = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is"},
                    {"type": "text", "text": "KV cache?"},
                ],
            },
            {"role": "assistant", "content": "Saved keys and values.", "refusal": None},
            {"role": "user", "content": "Thanks"},
        ],
    }
    conv = store.import_conversation(json.dumps(doc))
    assert conv.settings == ChatSettings(system_prompt="You are terse.")
    assert conv.title == "What is"  # the first line of the first user message
    assert [(m.role, m.content, m.position) for m in conv.messages] == [
        ("user", "What is\nKV cache?", 0),
        ("assistant", "Saved keys and values.", 1),
        ("user", "Thanks", 2),
    ]
    assert all(m.stats is None for m in conv.messages)


def test_an_imported_title_a_chat_already_has_is_marked_imported(store):
    source = store.create("Trip plans")
    store.append(source.id, "user", "Rome in May?")
    copy = store.import_conversation(store.export_json(source.id))
    assert copy.title == "Trip plans (imported)" and store.get(source.id).title == "Trip plans"
    long = "x" * 200
    store.import_conversation(
        json.dumps({"title": long, "messages": [{"role": "user", "content": "hi"}]})
    )
    second = store.import_conversation(
        json.dumps({"title": long, "messages": [{"role": "user", "content": "hi"}]})
    )
    assert second.title == "x" * 189 + " (imported)", "the mark survives the title limit"


def test_import_of_a_bare_list_and_a_titled_file(store):
    bare = store.import_conversation('[{"role": "user", "content": "  Plan a trip\\nto Rome"}]')
    assert (bare.title, bare.settings, [m.content for m in bare.messages]) == (
        "Plan a trip",
        ChatSettings(),
        ["  Plan a trip\nto Rome"],
    )
    titled = store.import_conversation(
        json.dumps(
            {"title": "  My   chat ", "messages": [{"role": "assistant", "content": "Hello!"}]}
        )
    )
    assert titled.title == "My chat"
    untitled = store.import_conversation('[{"role": "assistant", "content": "Hi"}]')
    assert untitled.title == DEFAULT_TITLE
    with_bom = store.import_conversation(
        b'\xef\xbb\xbf[{"role": "user", "content": "caf\xc3\xa9"}]'
    )
    assert with_bom.messages[0].content == "café"


TREE = {
    "format": "minisgl-chat conversation",
    "title": "t",
    "settings": {},
    "tree": [
        {"id": 1, "parent_id": None, "role": "user", "content": "a"},
        {"id": 2, "parent_id": 99, "role": "assistant", "content": "b"},
    ],
}


BAD_FILES = [  # (test id, the file's text, what the user is told)
    ("empty", "", "the file is empty"),
    ("blank", "\ufeff \n\t", "the file is empty"),
    ("prose", "hello", "not JSON: Expecting value at line 1 column 1"),
    ("broken", '{"messages": [}', "not JSON: Expecting value at line 1 column 15"),
    ("two-documents", "[] []", "not JSON: Extra data at line 1 column 4"),
    ("too-deep", "[" * 100_000, "not JSON that can be read: it is nested too deeply"),
    ("not-utf8", b"[\xff]", "not UTF-8 text: byte 2 (0xff) cannot be read; save the file as UTF-8"),
    (
        "a-number",
        "42",
        'expected a minisgl-chat export, an object with a "messages" list, '
        "or a list of messages; got a number",
    ),
    ("empty-list", "[]", "no messages to import"),
    ("no-messages", '{"messages": []}', "no messages to import"),
    (
        "only-system",
        '{"messages": [{"role": "system", "content": "only a prompt"}]}',
        "no messages to import",
    ),
    ("messages-text", '{"messages": "hi"}', "messages: expected a list of messages, got text"),
    ("message-text", '["hi"]', "messages[0]: expected an object with role and content, got text"),
    (
        "robot",
        '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, '
        '{"role": "user", "content": "c"}, {"role": "robot", "content": "d"}]',
        "messages[3].role: 'robot' is not one of user, assistant, system",
    ),
    (
        "tool",
        '[{"role": "tool", "content": "x"}]',
        "messages[0].role: 'tool' is not one of user, assistant, system",
    ),
    ("no-content", '[{"role": "user"}]', "messages[0].content is missing"),
    ("no-role", '[{"content": "x"}]', "messages[0].role is missing"),
    (
        "null-content",
        '[{"role": "assistant", "content": null}]',
        "messages[0].content: expected text or a list of text parts, got null",
    ),
    (
        "image",
        '[{"role": "user", "content": [{"type": "text", "text": "look"}, '
        '{"type": "image_url", "image_url": {}}]}]',
        "messages[0].content[1].type: only text parts can be imported, not 'image_url'",
    ),
    (
        "cut-emoji",
        '[{"role": "user", "content": "hi \\ud83d"}]',
        "messages[0].content: character 4 is '\\ud83d', half of a character pair (a cut emoji?); remove it",
    ),
    (
        "part-without-text",
        '[{"role": "user", "content": [{"type": "text"}]}]',
        "messages[0].content[0].text: expected text, got null",
    ),
    (
        "long-system-prompt",
        '[{"role": "system", "content": "' + "p" * 20_001 + '"}, {"role": "user", "content": "x"}]',
        "messages[0]: system prompt is 20,001 characters; the limit is 20,000",
    ),
    (
        "title-number",
        '{"title": 7, "messages": [{"role": "user", "content": "x"}]}',
        "title: expected text, got a number",
    ),
    (
        "bad-settings",
        '{"format": "minisgl-chat conversation", "settings": {"temperature": 9}, "messages": []}',
        "settings: temperature must be between 0 and 2 (got 9)",
    ),
    (
        "bad-stats",
        '{"format": "minisgl-chat conversation", "messages": [{"role": "user", "content": "x", '
        '"stats": {"tokens": "many"}}]}',
        "messages[0].stats.tokens: expected a whole number, got 'many'",
    ),
    (
        "bad-unanswered",
        '{"format": "minisgl-chat conversation", "messages": [{"role": "user", "content": "x", '
        '"stats": {"unanswered": "no"}}]}',
        "messages[0].stats.unanswered: expected true or false, got 'no'",
    ),  # 'no' would hide the question from the model
    (
        "unknown-parent",
        json.dumps(TREE),
        "tree[1].parent_id: 99 is not the id of an earlier message",
    ),
    (
        "unknown-leaf",
        json.dumps({**TREE, "tree": TREE["tree"][:1], "leaf_id": 5}),
        "leaf_id: 5 is not the id of a message in the tree",
    ),
    (
        "too-big",
        '[{"role": "user", "content": "' + "x" * 21_000_000 + '"}]',
        "the file is 21.0 MB; the limit is 20 MB",
    ),
]


@pytest.mark.parametrize("text, words", [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_a_bad_import_file_is_refused_with_a_message_a_user_can_act_on(store, text, words):
    with pytest.raises(BadImportFile) as err:
        store.import_conversation(text)
    assert str(err.value) == words
    assert isinstance(err.value, ValueError)
    assert nothing_stored(store)


def test_an_import_that_fails_while_storing_leaves_nothing(store, monkeypatch):
    """A failure once the messages are written (they go in one batch) rolls the whole import back."""
    from minisgl_app.chat.store import tree as tree_module

    calls = []

    def failing_set_leaf(*args):
        calls.append(args)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(tree_module, "set_leaf", failing_set_leaf)
    turns = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    with pytest.raises(sqlite3.OperationalError):
        store.import_conversation(json.dumps(turns))
    assert len(calls) == 1 and nothing_stored(store)


def test_imported_messages_take_ids_after_every_id_used_and_search_finds_them(store):
    """The batch insert gives ids as AUTOINCREMENT would: after every id ever used (a deleted
    chat's too), parents before children; the search index follows."""
    first = store.import_conversation(
        json.dumps([{"role": "user", "content": "alpha"}, {"role": "assistant", "content": "beta"}])
    )
    used = max(m.id for m in first.messages)
    store.delete(first.id)
    again = store.import_conversation(
        json.dumps(
            [{"role": "user", "content": "gamma words"}, {"role": "assistant", "content": "delta"}]
        )
    )
    ids = [m.id for m in again.messages]
    assert ids == [used + 1, used + 2] and again.messages[1].parent_id == ids[0]
    assert [c.id for c in store.search("gamma")] == [again.id]
    later = store.append(again.id, "user", "epsilon")
    assert later.id == used + 3


# ----------------------------------------------------------------------------- search


@pytest.fixture
def searchable(store):
    """Three chats, oldest first: a Paris chat, a French one with a hidden branch, a CJK one."""
    paris, [u, _] = chat(
        store, "What is the capital of France?", "Paris, a city of salt and pepper."
    )
    store.rename(paris.id, "Travel plans")
    french, [q, _] = chat(store, "Crème brûlée recipe", "Use cream and sugar.")
    hidden = store.add_message(french.id, q.id, "assistant", "Hidden branch mentions Paris")
    store.switch_version(french.id, hidden.id, -1)
    cjk, _ = chat(store, "什么是 KV Cache？", "Привет мир")
    return paris, french, cjk


def test_search_finds_titles_and_text_in_any_branch_most_recent_first(store, searchable):
    paris, french, cjk = searchable
    found = store.search("paris")
    assert [r.id for r in found] == [french.id, paris.id]  # french was updated later
    assert found[0].snippet == "Hidden branch mentions Paris"
    assert found[1].snippet == "Paris, a city of salt and pepper."
    assert [(r.id, r.snippet) for r in store.search("travel")] == [(paris.id, "")]  # the title
    assert [r.id for r in store.search("capital fra")] == [
        paris.id
    ]  # every word; the last a prefix
    assert store.search("capital sugar") == []  # words in different chats
    assert [r.id for r in store.search("Pari")] == [french.id, paris.id]
    assert store.search("par", limit=1) == store.search("par")[:1]
    assert found[0].message_count == 2


def test_search_follows_edits_renames_and_deletes(store, searchable):
    paris, french, cjk = searchable
    reply = store.get(paris.id).messages[1]
    store.update_message(reply.id, "Lyon is not the capital.")
    assert store.search("pepper") == [] and [r.id for r in store.search("lyon")] == [paris.id]
    store.rename(paris.id, "Geography")
    assert store.search("travel") == [] and [r.id for r in store.search("geography")] == [paris.id]
    assert [r.id for r in store.search("hidden")] == [french.id]
    store.truncate_after(french.id, 0)
    assert store.search("hidden") == []
    store.delete(paris.id)
    assert store.search("lyon") == [] and store.search("geography") == []


def test_search_matches_unicode_text(store, searchable):
    paris, french, cjk = searchable
    assert [r.id for r in store.search("creme brulee")] == [french.id]  # accents do not matter
    assert [r.id for r in store.search("BRÛL")] == [french.id]
    assert [r.id for r in store.search("什么")] == [cjk.id]  # the start of a run of CJK text
    assert [r.id for r in store.search("kv cache")] == [cjk.id]
    assert [r.id for r in store.search("привет")] == [cjk.id]  # case folded beyond ASCII


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '""',
        "*",
        "AND",
        "OR",
        "NOT",
        "and or not",
        "NEAR(a b)",
        "(",
        ")",
        "a OR",
        '"unterminated',
        'salt"',
        "^salt",
        "content:salt",
        "title:x",
        "-",
        "+",
        ":",
        "{a b}",
        "",
        "   ",
        "🐈",
        "\x00",
        "'; DROP TABLE messages; --",
        "x" * 1000,
        "a*b",
        "\\",
        "%",
        "_",
    ],
)
def test_search_never_raises_on_odd_input(store, searchable, query):
    results = store.search(query)
    assert isinstance(results, list)
    assert len(store.list()) == 3  # and it changed nothing


def test_search_treats_operators_and_quotes_as_text(store, searchable):
    paris, french, cjk = searchable
    assert [r.id for r in store.search("AND")] == [french.id, paris.id]  # the word "and"
    assert [r.id for r in store.search('"salt" pepper*')] == [paris.id]
    assert store.search('"') == store.search("*") == store.search("🐈") == []


# ----------------------------------------------------------------------------- settings and titles


def test_valid_settings_pass():
    ChatSettings().validate()
    ChatSettings(temperature=0, top_p=1, max_tokens=32768, system_prompt="x" * 20_000).validate()
    ChatSettings(temperature=2.0, top_p=1e-6, max_tokens=1).validate()


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(temperature=-0.1), "temperature must be between 0 and 2"),
        (dict(temperature=2.01), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top-p must be greater than 0"),
        (dict(top_p=1.5), "top-p"),
        (dict(max_tokens=0), "max tokens must be a whole number from 1 to 32,768"),
        (dict(max_tokens=32769), "max tokens"),
        (dict(max_tokens=12.5), "max tokens"),
        (dict(max_tokens=True), "max tokens"),
        (
            dict(system_prompt="x" * 20_001),
            "system prompt is 20,001 characters; the limit is 20,000",
        ),
    ],
)
def test_invalid_settings_raise_a_readable_value_error(bad, words):
    with pytest.raises(ValueError, match=words):
        ChatSettings(**bad).validate()


def test_every_invalid_setting_is_named_at_once():
    with pytest.raises(ValueError) as err:
        replace(ChatSettings(), temperature=9, top_p=0).validate()
    assert "temperature" in str(err.value) and "top-p" in str(err.value)


@pytest.mark.parametrize(
    "text, title",
    [
        ("What is the capital of France?", "What is the capital of France?"),
        ("\n\n   Explain   KV cache\nin detail please", "Explain KV cache"),
        ("", DEFAULT_TITLE),
        ("   \n  ", DEFAULT_TITLE),
        (
            "Please write a long story about a cat who learns to fly over the sea",
            "Please write a long story about a cat who learns to fly over the sea",
        ),
        (
            "Please write a long story about a cat who learns to fly over the sea, then back home again, "
            "and all the way to the moon",
            "Please write a long story about a cat who learns to fly over the sea, then back home again, and…",
        ),
        ("x" * 150, "x" * 99 + "…"),
        (
            "**notes.txt**\n```\nbuy milk\n```",
            "notes.txt",
        ),  # a file sent alone: its name, not its Markdown
        (
            "**Important:** read this first",
            "**Important:** read this first",
        ),  # bold inside a line stays as typed
    ],
)
def test_title_from_first_line(text, title):
    assert title_from(text) == title
    assert len(title_from(text)) <= TITLE_LENGTH


def test_questions_that_start_alike_get_titles_that_differ():
    """A title kept the first 48 characters of the first message: "Can you explain how the Python
    garbage collector handles reference cycles?" and "… weak references?" were both titled "Can you
    explain how the Python garbage…", and their chats looked the same in the sidebar (a new user's
    tour). A first line of up to TITLE_LENGTH (100) characters is the title whole."""
    first = title_from("Can you explain how the Python garbage collector handles reference cycles?")
    second = title_from("Can you explain how the Python garbage collector handles weak references?")
    assert (
        first != second
        and first.endswith("reference cycles?")
        and second.endswith("weak references?")
    ), (first, second)


# ----------------------------------------------------------------------------- the file


def test_database_lives_in_the_data_dir_and_is_private(data_dir):
    old = os.umask(0)  # SQLite on its own would create 0644 & ~umask: prove we do not rely on it
    try:
        with ConversationStore() as s:
            s.append(s.create().id, "user", "secret")
            path = data_dir / DB_NAME
            assert s.path == path
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            assert all(f.exists() for f in files)
            assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    finally:
        os.umask(old)
    assert mode(data_dir) == 0o700


def test_an_existing_loose_data_dir_and_file_are_tightened(data_dir):
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    (data_dir / DB_NAME).touch(mode=0o644)
    os.chmod(data_dir / DB_NAME, 0o644)
    ConversationStore().close()
    assert (mode(data_dir), mode(data_dir / DB_NAME)) == (0o700, 0o600)


def test_an_explicit_path_gets_a_private_new_folder(tmp_path):
    path = tmp_path / "new" / "folder" / "chats.sqlite3"
    ConversationStore(path).close()
    assert (mode(path.parent), mode(path)) == (0o700, 0o600)


def test_pragmas_wal_and_schema_version(store):
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn = store._connection()
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000


def test_everything_survives_reopening(data_dir):
    with ConversationStore() as s:
        conv = s.create("kept", ChatSettings(max_tokens=99))
        s.append(conv.id, "user", "hello")
        reply = s.append(conv.id, "assistant", "")
        s.update_message(reply.id, "half a rep", MessageStats(stopped=True))
        before = s.get(conv.id)
    with ConversationStore(data_dir / DB_NAME) as again:
        assert again.get(conv.id) == before
        assert [c.title for c in again.list()] == ["kept"]


# A version-1 database as the first release wrote it, spelled out here so that this test keeps
# describing real old files whatever later code does.
V1_SQL = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, settings TEXT NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    content TEXT NOT NULL, created_at REAL NOT NULL, stats TEXT);
INSERT INTO conversations VALUES (7, 'old chat', 100.0, 200.0, '{"temperature": 0.3}');
INSERT INTO messages VALUES (1, 7, 0, 'user', 'hi', 150.0, NULL);
INSERT INTO messages VALUES (2, 7, 1, 'assistant', 'hello', 160.0, '{"tokens": 2, "finish_reason": "stop"}');
PRAGMA user_version = 1;
"""


def test_a_version_1_database_is_migrated_and_keeps_its_data(tmp_path):
    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as raw:
        raw.executescript(V1_SQL)
    with ConversationStore(path) as s:
        conv = s.get(7)
        assert (conv.title, conv.settings) == ("old chat", ChatSettings(temperature=0.3))
        assert [(m.role, m.content, m.stats) for m in conv.messages] == [
            ("user", "hi", None),
            ("assistant", "hello", MessageStats(tokens=2, finish_reason="stop")),
        ]
        again = s.append(7, "user", "again")
        assert (again.position, again.parent_id) == (2, 2)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        # version 2's unique positions went in version 3, where versions of a message share one
        assert "messages_by_position" not in indexes and "messages_by_conversation" in indexes
        assert raw.execute(
            "SELECT id, parent_id, position FROM messages ORDER BY id"
        ).fetchall() == [(1, None, 0), (2, 1, 1), (3, 2, 2)]


V2_FILE = Path(__file__).resolve().parents[1] / "data" / "chats-v2.sqlite3"


def test_the_previous_releases_v2_file_becomes_one_branch_trees(tmp_path):
    """tests/data/chats-v2.sqlite3 was written by the release with schema version 2 (app/chat/store.py at
    commit 1b897c89, taken with `git show`) through its own API, on a fake clock:
    `.venv/bin/python tests/data/make_chats_v2.py` makes it again. It holds "Capitals" (system
    prompt, a stopped reply), a deleted chat (a gap in the ids), "Deux 🐈" (truncated and appended
    to, as v2 regenerated) and an empty chat."""
    path = tmp_path / DB_NAME
    shutil.copyfile(V2_FILE, path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
    with ConversationStore(path) as s:
        assert [(c.id, c.title, c.message_count) for c in s.list()] == [
            (4, "empty", 0),
            (3, "Deux 🐈", 4),
            (1, "Capitals", 4),
        ]
        capitals = s.get(1)
        assert (capitals.created_at, capitals.updated_at) == (1764000001.0, 1764000006.0)
        assert capitals.settings == ChatSettings(
            system_prompt="Answer in one word.", temperature=0.2
        )
        assert [
            (m.id, m.parent_id, m.position, m.role, m.content, m.stats) for m in capitals.messages
        ] == [
            (1, None, 0, "user", "What is the capital of France?", None),
            (2, 1, 1, "assistant", "Paris.", MessageStats(12.5, 80.0, 3, "stop", False)),
            (3, 2, 2, "user", "And of Italy?", None),
            (
                4,
                3,
                3,
                "assistant",
                "Rome",
                MessageStats(tokens=2, finish_reason="abort", stopped=True),
            ),
        ]
        deux = s.get(3)
        assert deux.settings == ChatSettings(max_tokens=2048, thinking=True)
        assert [(m.id, m.parent_id, m.position, m.content) for m in deux.messages] == [
            (6, None, 0, "message 0"),
            (7, 6, 1, "message 1"),
            (10, 7, 2, "Bonjour, ça va ?"),
            (11, 10, 3, "<think>hm</think>Très bien."),
        ]
        assert all(
            (m.sibling_index, m.sibling_count) == (0, 1) for m in capitals.messages + deux.messages
        )
        assert s.get(4).messages == []
        with pytest.raises(NotFoundError):
            s.get(2)
        # the old text is in the search index, and the chats go on as trees
        assert [c.id for c in s.search("rome")] == [1] and [c.id for c in s.search("deux")] == [3]
        assert (s.append(1, "user", "And Spain?").parent_id, s.get(1).messages[-1].position) == (
            4,
            4,
        )
        regenerated = s.add_message(3, 10, "assistant", "Bien, merci.")
        assert (regenerated.sibling_index, regenerated.sibling_count) == (1, 2)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        assert raw.execute("SELECT id, leaf_id FROM conversations ORDER BY id").fetchall() == [
            (1, 12),
            (3, 13),
            (4, None),
        ]


def test_a_failing_v3_migration_leaves_the_v2_file_as_it_was(tmp_path, monkeypatch):
    from minisgl_app.chat.store import schema as schema_module

    path = tmp_path / DB_NAME
    shutil.copyfile(V2_FILE, path)

    def broken(*args):
        raise sqlite3.OperationalError("no such module: fts5")

    monkeypatch.setattr(schema_module, "_v3_search_index", broken)  # after the trees are linked
    with pytest.raises(sqlite3.OperationalError, match="fts5"):
        ConversationStore(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
        assert "parent_id" not in {r[1] for r in raw.execute("PRAGMA table_info(messages)")}
        assert (
            raw.execute(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'messages_by_position'"
            ).fetchone()[0]
            == 1
        )
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 8
    monkeypatch.undo()
    with ConversationStore(path) as s:  # and the next start migrates it
        assert len(s.get(1).messages) == 4


def test_schema_3_has_trees_and_a_search_index(store):
    with sqlite3.connect(store.path) as raw:
        objects = {
            (r[0], r[1])
            for r in raw.execute(
                "SELECT type, name FROM sqlite_master WHERE name NOT LIKE '%fts\\_%' ESCAPE '\\'"
            )
        }
        assert objects >= {
            ("table", "conversations"),
            ("table", "messages"),
            ("table", "messages_fts"),
            ("table", "conversations_fts"),
            ("index", "conversations_by_update"),
            ("index", "messages_by_conversation"),
            ("index", "messages_by_parent"),
            ("index", "conversations_by_leaf"),
        }
        triggers = {
            r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        }
        search = {
            f"{t}_fts_{op}"
            for t in ("messages", "conversations")
            for op in ("insert", "delete", "update")
        }
        revisions = {
            "conversations_revised",
            *(f"messages_{op}_revise" for op in ("insert", "update", "delete")),
        }  # version 5
        assert triggers == search | revisions
        keys = {(r[2], r[3], r[6]) for r in raw.execute("PRAGMA foreign_key_list(messages)")}
        assert keys == {
            ("conversations", "conversation_id", "CASCADE"),
            ("messages", "parent_id", "CASCADE"),
        }
        assert [
            (r[2], r[3], r[6]) for r in raw.execute("PRAGMA foreign_key_list(conversations)")
        ] == [("messages", "leaf_id", "SET NULL")]


def test_deleting_a_message_outside_the_store_cascades_to_its_subtree(store):
    conv, [u, a, u2] = chat(store, "u", "a", "u2")
    with sqlite3.connect(store.path) as raw:
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM messages WHERE id = ?", (a.id,))
    assert [m.content for m in store.get(conv.id).messages] == []  # the leaf was deleted: SET NULL
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT id FROM messages").fetchall() == [(u.id,)]


def test_a_version_0_database_gets_the_whole_schema(tmp_path):
    path = tmp_path / DB_NAME
    sqlite3.connect(path).close()  # an empty file, user_version 0
    with ConversationStore(path) as s:
        s.append(s.create().id, "system", "ok")
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_failing_migration_leaves_the_old_database_untouched(tmp_path, monkeypatch):
    from minisgl_app.chat.store import schema as schema_module

    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as raw:
        raw.executescript(V1_SQL)

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(schema_module, "MIGRATIONS", [schema_module.MIGRATIONS[0], broken])
    with pytest.raises(RuntimeError, match="disk on fire"):
        ConversationStore(path)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master")}
        assert "half_done" not in tables and "messages_by_position" not in tables
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_a_database_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    with pytest.raises(
        SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 5}.*upgrade minisgl-chat"
    ):
        ConversationStore(path)
    with sqlite3.connect(path) as raw:  # and left as it was
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 5
        assert raw.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0


# ----------------------------------------------------------------------------- concurrent writers


def assert_all_appends_landed(path: Path, conv_id: int, expected: set[str]) -> None:
    with ConversationStore(path) as s:
        messages = s.get(conv_id).messages
    assert {m.content for m in messages} == expected
    assert [m.position for m in messages] == list(range(len(expected)))  # unique, no gaps
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_eight_threads_append_fifty_each(tmp_path, shared):
    path = tmp_path / DB_NAME
    main = ConversationStore(path)
    conv = main.create()
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        s = main if shared else ConversationStore(path)
        try:
            for i in range(50):
                msg = s.append(conv.id, "user", f"t{t}-{i}")
                # reads then writes: fails with "database is locked" unless writes begin IMMEDIATE
                s.update_message(msg.id, f"t{t}-{i}", MessageStats(tokens=i))
                if i % 10 == 0:
                    s.list()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            if not shared:
                s.close()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    main.close()
    assert errors == []
    assert_all_appends_landed(path, conv.id, {f"t{t}-{i}" for t in range(8) for i in range(50)})


def _append_from_process(path: str, conv_id: int, tag: str, start: multiprocessing.Event) -> None:
    with ConversationStore(Path(path)) as s:
        start.wait(30)
        for i in range(50):
            s.append(conv_id, "user", f"{tag}-{i}")


def test_two_processes_and_a_thread_append_to_one_conversation(tmp_path):
    path = tmp_path / DB_NAME
    with ConversationStore(path) as s:
        conv = s.create()
        ctx = multiprocessing.get_context("spawn")
        start = ctx.Event()
        procs = [
            ctx.Process(target=_append_from_process, args=(str(path), conv.id, f"p{n}", start))
            for n in range(2)
        ]
        for p in procs:
            p.start()
        start.set()
        for i in range(50):  # this process writes at the same time
            s.append(conv.id, "assistant", f"main-{i}")
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
    assert_all_appends_landed(
        path, conv.id, {f"{tag}-{i}" for tag in ("p0", "p1", "main") for i in range(50)}
    )


# ---- which model wrote each reply (schema version 4)


def file_at_version(path: Path, version: int, messages_sql: str, leaf_id: int) -> None:
    """A database as release ``version`` of the schema left it (its first ``version`` migration
    steps), holding chat 1 ('old') with the messages ``messages_sql`` inserts."""
    from minisgl_app.chat.store import MIGRATIONS

    raw = sqlite3.connect(path)
    for step in MIGRATIONS[:version]:
        step(raw)
    raw.execute(f"PRAGMA user_version = {version}")
    raw.execute(
        "INSERT INTO conversations (id, title, created_at, updated_at, settings) VALUES (1, 'old', 1.0, 2.0, '{}')"
    )
    raw.execute(
        "INSERT INTO messages (id, conversation_id, parent_id, position, role, content, created_at, stats) "
        + messages_sql
    )
    raw.execute("UPDATE conversations SET leaf_id = ? WHERE id = 1", (leaf_id,))
    raw.commit()
    raw.close()


def test_a_version_3_file_gains_the_reply_model_and_keeps_its_chats(tmp_path):
    """A database of schema version 3 (made by the first three migration steps, as the release
    before the models panel left it) opens with its chats whole; its old replies have no model
    (unknown), new ones remember theirs, and a stream's updates keep it."""
    path = tmp_path / DB_NAME
    file_at_version(
        path,
        3,
        "VALUES (1, 1, NULL, 0, 'user', 'hi', 1.0, NULL), (2, 1, 1, 1, 'assistant', 'hello', 2.0, '{\"tokens\": 2}')",
        leaf_id=2,
    )
    with ConversationStore(path) as s:
        old = s.get(1)
        assert [(m.content, m.model) for m in old.messages] == [("hi", None), ("hello", None)]
        s.append(1, "user", "again")
        reply = s.append(1, "assistant", "", stats={"tokens": 0}, model="tiny-chat")
        s.update_message(reply.id, "growing")  # a stream's update leaves the model alone
        s.update_message(
            reply.id,
            "done",
            {"tokens": 3, "stopped": True, "stopped_by": "switch to SmolLM2-135M-Instruct"},
        )
        last = s.get(1).messages[-1]
        assert (last.content, last.model, last.stats.stopped_by) == (
            "done",
            "tiny-chat",
            "switch to SmolLM2-135M-Instruct",
        )
        assert [c.title for c in s.search("hello")] == ["old"]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_reply_model_travels_through_export_and_import(store):
    conv = store.create("models")
    store.append(conv.id, "user", "hi")
    store.append(conv.id, "assistant", "hello", stats={"tokens": 1}, model="tiny-chat")
    doc = json.loads(store.export_json(conv.id))
    assert [m["model"] for m in doc["messages"]] == [None, "tiny-chat"]
    assert "tiny-chat" in store.export_markdown(conv.id)
    again = store.import_conversation(json.dumps(doc))
    assert [m.model for m in again.messages] == [None, "tiny-chat"]
    doc["messages"][1]["model"] = 7
    doc.pop("tree")
    with pytest.raises(BadImportFile, match=r"messages\[1\]\.model: expected text or null"):
        store.import_conversation(json.dumps(doc))


# ---- each conversation counts its writes (schema version 5)


def test_every_write_to_a_chat_raises_its_revision_and_no_other_chats(store):
    """A page compares a chat's revision with the one it showed: every change to the chat,
    a streamed reply's update included (it leaves updated_at alone), must raise it, and a write
    to another chat must not."""
    a, b = store.create("a"), store.create("b")
    seen = [store.revision(a.id)]

    def changed() -> bool:
        now = store.revision(a.id)
        grew = now > seen[-1]
        seen.append(now)
        return grew

    question = store.append(a.id, "user", "hi")
    assert changed()
    reply = store.append(a.id, "assistant", "", stats={"tokens": 0})
    assert changed()
    store.update_message(reply.id, "hello")
    assert changed()
    other = store.add_message(a.id, question.id, "assistant", "hey")
    assert changed()
    store.switch_version(a.id, other.id, -1)
    assert changed()
    store.rename(a.id, "renamed")
    assert changed()
    store.update_settings(a.id, replace(default_settings(), temperature=0.5))
    assert changed()
    store.delete_message(a.id, reply.id)
    assert changed()
    before_b = store.revision(b.id)
    store.append(b.id, "user", "elsewhere")
    assert not changed() and store.revision(b.id) > before_b
    assert store.get(a.id).revision == store.revision(a.id)
    store.delete(a.id)
    with pytest.raises(NotFoundError):
        store.revision(a.id)


def test_a_version_4_file_gains_revisions_and_keeps_its_chats(tmp_path):
    path = tmp_path / DB_NAME
    file_at_version(path, 4, "VALUES (1, 1, NULL, 0, 'user', 'hi', 1.0, NULL)", leaf_id=1)
    with ConversationStore(path) as s:
        assert [m.content for m in s.get(1).messages] == ["hi"]
        before = s.revision(1)
        s.append(1, "assistant", "hello")
        assert s.revision(1) > before
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ---- the package's shape

# Each of the store's modules imports only modules on a lower floor: plain records at the bottom,
# the composed ConversationStore at the top.
STORE_FLOORS = {
    "records": 0,
    "database": 0,
    "schema": 1,
    "rows": 1,
    "import_file": 1,
    "base": 2,
    "tree": 2,
    "conversations": 3,
    "messages": 3,
    "search": 3,
    "import_export": 3,
    "tool_servers": 3,
    "conversation_store": 4,
    "__init__": 5,
}


def store_imports(path: Path) -> set[str]:
    """The store's modules that ``path`` imports (``from .x import ...`` and ``from . import x``)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_the_store_modules_import_only_downward():
    from minisgl_app.chat import store as store_package

    folder = Path(store_package.__file__).parent
    assert {p.stem for p in folder.glob("*.py")} == set(STORE_FLOORS), (
        "give a new module its floor here"
    )
    upward = [
        f"{p.stem} imports {name}"
        for p in sorted(folder.glob("*.py"))
        for name in sorted(store_imports(p))
        if STORE_FLOORS[name] >= STORE_FLOORS[p.stem]
    ]
    assert not upward, upward


def test_every_name_the_package_exports_resolves():
    from minisgl_app.chat import store as store_package

    assert all(getattr(store_package, name) is not None for name in store_package.__all__)
