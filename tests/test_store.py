"""The conversation store: what the chat UI relies on when it saves, lists, exports and reloads."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from minisgl_app.store import (
    DB_NAME,
    DEFAULT_TITLE,
    SCHEMA_VERSION,
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
    store.append(conv.id, "assistant", "Paris.", MessageStats(ttft_ms=12.5, tok_s=80.0, tokens=3,
                                                             finish_reason="stop"))
    got = store.get(conv.id)
    assert [(m.position, m.role, m.content) for m in got.messages] == [
        (0, "user", "What is the capital of France?"), (1, "assistant", "Paris.")]
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
    store.update_message(reply.id, "done", {"ttft_ms": 5.0, "tok_s": 9.5, "tokens": 3,
                                            "finish_reason": "stop", "stopped": False})
    assert store.get(conv.id).messages[0].stats == MessageStats(5.0, 9.5, 3, "stop", False)
    with pytest.raises(TypeError):
        store.update_message(reply.id, "x", {"tokns": 3})


def test_streamed_reply_is_created_once_and_updated_until_stopped(store):
    conv = store.create()
    store.append(conv.id, "user", "Count to ten.")
    reply = store.append(conv.id, "assistant", "")
    for shown in ["1", "1 2", "1 2 3"]:
        store.update_message(reply.id, shown)
    store.update_message(reply.id, "1 2 3 4", MessageStats(tokens=7, finish_reason="abort", stopped=True))
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
    for call in (lambda: store.get(conv.id), lambda: store.append(conv.id, "user", "hi"),
                 lambda: store.rename(conv.id, "x"), lambda: store.delete(conv.id),
                 lambda: store.truncate_after(conv.id, 0), lambda: store.update_message(999, "x"),
                 lambda: store.update_settings(conv.id, ChatSettings()), lambda: store.export_json(conv.id)):
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
    store.rename(b.id, "b2")
    assert [(s.title, s.message_count) for s in store.list()] == [("b2", 0), ("a", 1), ("c", 0)]
    store.delete(c.id)
    assert [s.id for s in store.list()] == [b.id, a.id]


def test_truncate_after_drops_later_messages_and_positions_continue(store):
    conv = store.create()
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        store.append(conv.id, role, f"m{i}")
    store.truncate_after(conv.id, 2)  # regenerate: keep the last user message
    assert [m.content for m in store.get(conv.id).messages] == ["m0", "m1", "m2"]
    store.truncate_after(conv.id, 1)  # edit-and-resend: drop it too, then append the edit
    new = store.append(conv.id, "user", "m2 edited")
    assert (new.position, [m.content for m in store.get(conv.id).messages]) == (2, ["m0", "m1", "m2 edited"])
    store.truncate_after(conv.id, -1)
    assert store.get(conv.id).messages == []


def test_delete_cascades_to_messages(store):
    keep, gone = store.create("keep"), store.create("gone")
    store.append(keep.id, "user", "stay")
    store.append(gone.id, "user", "go")
    store.append(gone.id, "assistant", "went")
    store.delete(gone.id)
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("SELECT conversation_id, content FROM messages").fetchall() == [(keep.id, "stay")]


# ----------------------------------------------------------------------------- export

def test_export_markdown_contains_title_system_prompt_and_messages(store):
    conv = store.create("Capitals", ChatSettings(system_prompt="Answer in one word."))
    store.append(conv.id, "user", "Capital of France?")
    store.append(conv.id, "assistant", "```\nParis\n```", MessageStats(ttft_ms=30, tok_s=42.0, tokens=4,
                                                                   stopped=True))
    md = store.export_markdown(conv.id)
    assert md.startswith("# Capitals\n")
    assert "> Answer in one word." in md
    assert "## User\n\nCapital of France?" in md
    assert "## Assistant\n\n```\nParis\n```" in md
    assert "42.0 tok/s" in md and "stopped" in md


def test_export_json_round_trips(store):
    settings = ChatSettings(system_prompt="Réponds en français.", temperature=1.3, top_p=0.5,
                            max_tokens=2048, thinking=True)
    conv = store.create("Deux 🐈", settings)
    store.append(conv.id, "user", "Bonjour")
    store.append(conv.id, "assistant", "<think>hm</think>Salut", MessageStats(tokens=5, finish_reason="stop"))
    doc = json.loads(store.export_json(conv.id))
    got = store.get(conv.id)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert (doc["id"], doc["title"]) == (got.id, "Deux 🐈")
    assert ChatSettings.from_dict(doc["settings"]) == settings
    assert [(m["position"], m["role"], m["content"], m["created_at"],
             MessageStats.from_dict(m["stats"]) if m["stats"] else None) for m in doc["messages"]] == [
        (m.position, m.role, m.content, m.created_at, m.stats) for m in got.messages]


# ----------------------------------------------------------------------------- settings and titles

def test_valid_settings_pass():
    ChatSettings().validate()
    ChatSettings(temperature=0, top_p=1, max_tokens=32768, system_prompt="x" * 20_000).validate()
    ChatSettings(temperature=2.0, top_p=1e-6, max_tokens=1).validate()


@pytest.mark.parametrize("bad, words", [
    (dict(temperature=-0.1), "temperature must be between 0 and 2"),
    (dict(temperature=2.01), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top-p must be greater than 0"),
    (dict(top_p=1.5), "top-p"),
    (dict(max_tokens=0), "max tokens must be a whole number from 1 to 32768"),
    (dict(max_tokens=32769), "max tokens"),
    (dict(max_tokens=12.5), "max tokens"),
    (dict(max_tokens=True), "max tokens"),
    (dict(system_prompt="x" * 20_001), "system prompt is 20,001 characters; the limit is 20,000"),
])
def test_invalid_settings_raise_a_readable_value_error(bad, words):
    with pytest.raises(ValueError, match=words):
        ChatSettings(**bad).validate()


def test_every_invalid_setting_is_named_at_once():
    with pytest.raises(ValueError) as err:
        replace(ChatSettings(), temperature=9, top_p=0).validate()
    assert "temperature" in str(err.value) and "top-p" in str(err.value)


@pytest.mark.parametrize("text, title", [
    ("What is the capital of France?", "What is the capital of France?"),
    ("\n\n   Explain   KV cache\nin detail please", "Explain KV cache"),
    ("", DEFAULT_TITLE),
    ("   \n  ", DEFAULT_TITLE),
    ("Please write a long story about a cat who learns to fly over the sea",
     "Please write a long story about a cat who…"),
    ("x" * 100, "x" * 47 + "…"),
])
def test_title_from_first_line(text, title):
    assert title_from(text) == title
    assert len(title_from(text)) <= 48


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
            ("user", "hi", None), ("assistant", "hello", MessageStats(tokens=2, finish_reason="stop"))]
        assert s.append(7, "user", "again").position == 2
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "messages_by_position" in indexes
        with pytest.raises(sqlite3.IntegrityError):  # positions are now unique per conversation
            raw.execute("INSERT INTO messages VALUES (9, 7, 0, 'user', 'dup', 1.0, NULL)")


def test_a_version_0_database_gets_the_whole_schema(tmp_path):
    path = tmp_path / DB_NAME
    sqlite3.connect(path).close()  # an empty file, user_version 0
    with ConversationStore(path) as s:
        s.append(s.create().id, "system", "ok")
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_failing_migration_leaves_the_old_database_untouched(tmp_path, monkeypatch):
    from minisgl_app import store as store_module

    path = tmp_path / DB_NAME
    with sqlite3.connect(path) as raw:
        raw.executescript(V1_SQL)

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store_module, "MIGRATIONS", [store_module.MIGRATIONS[0], broken])
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
    with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 5}.*upgrade minisgl-chat"):
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
        procs = [ctx.Process(target=_append_from_process, args=(str(path), conv.id, f"p{n}", start))
                 for n in range(2)]
        for p in procs:
            p.start()
        start.set()
        for i in range(50):  # this process writes at the same time
            s.append(conv.id, "assistant", f"main-{i}")
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
    assert_all_appends_landed(path, conv.id, {f"{tag}-{i}" for tag in ("p0", "p1", "main") for i in range(50)})
