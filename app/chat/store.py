"""The conversation store: chats, their messages and per-conversation settings in one SQLite file.

A conversation is a tree of messages: each message has a parent (none for a first message), and
regenerating or editing adds a sibling instead of overwriting, so every version is kept. The chat
shown is the path from the root to the conversation's selected leaf (``leaf_id``); ``position``
is a message's depth in the tree, so on that path it is 0, 1, 2, ... as in a linear chat. An FTS5
index over titles and message text, kept in sync by triggers, serves :meth:`search`.

The file lives at ``platformdirs.user_data_dir("minisgl-chat")/chats.sqlite3`` (the folder can be
overridden with ``MINISGL_DATA_DIR``). It is private to the user (file 0600, folder 0700), runs in
WAL mode with foreign keys on, and carries its schema version in ``PRAGMA user_version``; opening
an older file migrates it in one transaction, a newer one is refused.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a crash never leaves half a turn and
concurrent writers (threads of the UI, a second app process) wait for each other instead of
failing. A streamed reply is appended once and then updated as it grows; its last update is what
the user saw, a stopped reply included.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import platformdirs

APP_NAME = "minisgl-chat"
DATA_DIR_ENV = "MINISGL_DATA_DIR"
DB_NAME = "chats.sqlite3"
EXPORT_FORMAT = "minisgl-chat conversation"
DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 100
ROLES = ("user", "assistant", "system")
MAX_TOKENS_LIMIT = 32768
SYSTEM_PROMPT_LIMIT = 20_000
# The page's repetition penalty (vLLM's: on the prompt's and the reply's tokens; 1 = off). Small
# models loop without one: the demo model at the page's temperature (0.3) repeats a line of a
# poem to the token limit at 1.0, still at the end of a 512-token poem at 1.1, not at 1.15 (at
# 1.2 it drifts off the question, at 1.3 into nonsense). The OpenAI routes keep 1.0, as other
# servers do. REPETITION_PENALTY_MAX: the page's bound.
DEFAULT_REPETITION_PENALTY = 1.15
REPETITION_PENALTY_MAX = 2.0
STOP_STRINGS_LIMIT = 8
BUSY_TIMEOUT_S = 30.0
IMPORT_LIMIT_BYTES = 20_000_000  # "20 MB" in what the user is told
IMPORT_TITLE_LIMIT = 200  # characters; the UI's rename box allows as many
SNIPPET_TOKENS = 12  # words of context in a search result's snippet


class NotFoundError(KeyError):
    """No conversation or message with that id (deleted, or never created)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else "not found"


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer minisgl-chat than this one."""


class BadImportFile(ValueError):
    """A file given to :meth:`ConversationStore.import_conversation` cannot be imported; the
    message says where and what is wrong, so the user can fix the file (not named ImportError,
    which is Python's own)."""


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation generation settings."""

    system_prompt: str = ""
    temperature: float = 0.3
    top_p: float = 0.9
    max_tokens: int = 512
    thinking: bool = False
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None  # None: a new random draw each reply
    stop: tuple[str, ...] = ()  # the reply ends before any of these strings
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY  # 1: off
    backend: str | None = None  # where replies come from when the app has several ("local", "remote"); None: the first

    def problems(self) -> dict[str, str]:
        """Each invalid value's field name and what is wrong with it, in words a user can act on."""
        problems = {}
        if not isinstance(self.system_prompt, str):
            problems["system_prompt"] = "system prompt must be text"
        elif len(self.system_prompt) > SYSTEM_PROMPT_LIMIT:
            problems["system_prompt"] = (f"system prompt is {len(self.system_prompt):,} characters; "
                                         f"the limit is {SYSTEM_PROMPT_LIMIT:,}")
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            problems["temperature"] = f"temperature must be between 0 and 2 (got {shown_value(self.temperature)})"
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            problems["top_p"] = f"top-p must be greater than 0 and at most 1 (got {shown_value(self.top_p)})"
        if (not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool)
                or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT):
            problems["max_tokens"] = f"max tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT:,} (got {shown_value(self.max_tokens)})"
        if not isinstance(self.thinking, bool):
            problems["thinking"] = f"thinking must be on or off (got {shown_value(self.thinking)})"
        if not _is_whole(self.top_k) or not 0 <= self.top_k <= 1000:
            problems["top_k"] = f"top-k must be a whole number from 0 (off) to 1000 (got {shown_value(self.top_k)})"
        if self.seed is not None and (not _is_whole(self.seed) or not 0 <= self.seed < 2**63):
            problems["seed"] = f"seed must be empty or a whole number from 0 to 2^63-1 (got {shown_value(self.seed)})"
        if not _is_number(self.repetition_penalty) or not 1.0 <= self.repetition_penalty <= REPETITION_PENALTY_MAX:
            problems["repetition_penalty"] = (f"repetition penalty must be between 1 (off) and {REPETITION_PENALTY_MAX:g} "
                                              f"(got {shown_value(self.repetition_penalty)})")
        if not isinstance(self.stop, tuple) or len(self.stop) > STOP_STRINGS_LIMIT \
                or not all(isinstance(x, str) and 0 < len(x) <= 100 for x in self.stop):
            problems["stop"] = f"stop strings: at most {STOP_STRINGS_LIMIT}, each 1 to 100 characters"
        if self.backend is not None and (not isinstance(self.backend, str) or not 0 < len(self.backend) <= 40):
            problems["backend"] = f"replies from: expected the name of a backend (got {shown_value(self.backend)})"
        return problems

    def validate(self) -> None:
        """Raise ValueError naming every invalid value (see ``problems``)."""
        if problems := self.problems():
            raise ValueError("; ".join(problems.values()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatSettings:
        """Known keys only; missing keys take their defaults (files written by other versions)."""
        known = _known_fields(cls, data)
        if isinstance(known.get("stop"), list):  # JSON has no tuples
            known["stop"] = tuple(known["stop"])
        return cls(**known)


@dataclass(frozen=True)
class MessageStats:
    """What the UI shows under a reply; ``stopped`` is set when the user pressed Stop. A question
    has stats only when it was left ``unanswered``: the chat stopped before its turn came and a
    later question was sent (the model does not see it then; view.left_unanswered)."""

    ttft_ms: float | None = None
    tok_s: float | None = None
    tokens: int | None = None
    finish_reason: str | None = None
    stopped: bool = False
    stopped_by: str | None = None  # why it stopped when not by the user, e.g. "switch to <model>"
    unanswered: bool = False  # a question: left without a reply (see above)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MessageStats:
        return cls(**_known_fields(cls, data))

    def summary(self) -> str:
        """The line under a reply, on the page and in a Markdown export: "0.12 s to first token
        · 35.2 tok/s · 120 tokens", then how it ended if not by itself ("hit the token limit",
        "stopped")."""
        parts = ["not answered"] if self.unanswered else []
        if self.ttft_ms is not None:
            parts.append(f"{self.ttft_ms / 1000:.2f} s to first token")
        if self.tok_s is not None:
            parts.append(f"{self.tok_s:.1f} tok/s")
        if self.tokens is not None:
            parts.append(f"{self.tokens} {plural('token', self.tokens)}")
        if self.stopped:
            parts.append(f"stopped ({self.stopped_by})" if self.stopped_by else "stopped")
        elif self.finish_reason == "length":
            parts.append("hit the token limit")
        return " · ".join(parts)


@dataclass(frozen=True)
class Message:
    """One node of a conversation's tree. ``sibling_index``/``sibling_count`` place it among the
    versions that share its parent (oldest first), so the UI can show ‹ 2/3 ›; they are filled
    in on messages read back by ``get``, ``append`` and ``add_message``."""

    id: int
    conversation_id: int
    position: int  # depth in the tree: 0, 1, 2, ... along the shown path
    role: str  # 'user' | 'assistant' | 'system'
    content: str
    created_at: float  # unix seconds
    stats: MessageStats | None = None
    parent_id: int | None = None  # None for a first message (one of the root versions)
    sibling_index: int = 0
    sibling_count: int = 1
    model: str | None = None  # a reply: the model that wrote it (None: unknown, e.g. stored before v4)


@dataclass(frozen=True)
class ConversationSummary:
    """One row of the sidebar (or of search results, with ``snippet`` from the matching text)."""

    id: int
    title: str
    created_at: float
    updated_at: float
    message_count: int  # messages on the shown path
    snippet: str = ""  # search only: a few words around a match in a message; "" for a title hit


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    settings: ChatSettings
    messages: list[Message] = field(default_factory=list)
    revision: int = 0  # its write count when read (ConversationStore.revision)


# Stats may be given as a MessageStats or a dict with the same keys; they are read back as MessageStats.
StatsLike = MessageStats | Mapping[str, Any]


def default_settings() -> ChatSettings:
    """The settings a new conversation starts with."""
    return ChatSettings()


def title_from(text: str) -> str:
    """A sidebar title from a first user message: its first non-blank line, at most TITLE_LENGTH characters
    (the sidebar cuts it in its middle, keeping its last words: questions that start alike differ there)."""
    line = next((" ".join(ln.split()) for ln in text.splitlines() if ln.strip()), "")
    if len(line) > 4 and line.startswith("**") and line.endswith("**"):
        # a line all in bold: a file sent alone starts with its name so (ui.with_attachments), and
        # the sidebar shows titles as plain text ("**notes.txt**" was seen on a new user's tour)
        line = line[2:-2].strip() or line
    if not line:
        return DEFAULT_TITLE
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[:TITLE_LENGTH - 1]
    space = cut.rfind(" ")
    if space >= TITLE_LENGTH // 2:  # end on a whole word when that loses little
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def data_dir() -> Path:
    """The app's data folder: ``$MINISGL_DATA_DIR`` or the platform's user data dir."""
    return Path(os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir(APP_NAME))


def default_path() -> Path:
    return data_dir() / DB_NAME


# ----------------------------------------------------------------------------- schema

def _v1_tables(conn: sqlite3.Connection) -> None:
    conn.execute("""
        CREATE TABLE conversations (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            title      TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            settings   TEXT NOT NULL            -- ChatSettings as JSON
        )""")
    conn.execute("""
        CREATE TABLE messages (
            id              INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            position        INTEGER NOT NULL,
            role            TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            content         TEXT NOT NULL,
            created_at      REAL NOT NULL,
            stats           TEXT                -- MessageStats as JSON, or NULL
        )""")


def _v2_indexes(conn: sqlite3.Connection) -> None:
    # one message per position in a conversation; the sidebar's recency order
    conn.execute("CREATE UNIQUE INDEX messages_by_position ON messages (conversation_id, position)")
    conn.execute("CREATE INDEX conversations_by_update ON conversations (updated_at)")


def _v3_trees_and_search(conn: sqlite3.Connection) -> None:
    """Messages become trees (each linear chat one branch) and titles and text get an FTS5 index.
    This step and the helpers it calls are part of version 3: never edit them."""
    conn.execute("DROP INDEX messages_by_position")  # versions share a depth now
    # ALTER TABLE keeps the rows (rebuilding the table would need foreign keys off, which cannot
    # change inside this transaction); a REFERENCES column may be added as its default is NULL.
    conn.execute("ALTER TABLE messages ADD COLUMN "
                 "parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE")
    conn.execute("ALTER TABLE conversations ADD COLUMN "
                 "leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL")
    _v3_link_linear_chats(conn)
    # by conversation and depth; the parent index also serves the cascade, the leaf index the
    # SET NULL (without them, each deleted message would scan a whole table)
    conn.execute("CREATE INDEX messages_by_conversation ON messages (conversation_id, position)")
    conn.execute("CREATE INDEX messages_by_parent ON messages (parent_id)")
    conn.execute("CREATE INDEX conversations_by_leaf ON conversations (leaf_id)")
    _v3_search_index(conn, "messages_fts", "messages", "content")
    _v3_search_index(conn, "conversations_fts", "conversations", "title")


def _v3_link_linear_chats(conn: sqlite3.Connection) -> None:
    """Parent = the message one position earlier, leaf = the last message; positions are renumbered
    0, 1, 2, ... in their old order (they had no gaps, but a depth must not have any)."""
    rows = conn.execute("SELECT id, conversation_id FROM messages "
                        "ORDER BY conversation_id, position, id").fetchall()
    last: dict[int, tuple[int, int]] = {}  # conversation -> (id, position) of its last message
    links = []
    for message_id, conv_id in rows:
        parent, parent_position = last.get(conv_id, (None, -1))
        last[conv_id] = (message_id, parent_position + 1)
        links.append((parent, parent_position + 1, message_id))
    conn.executemany("UPDATE messages SET parent_id = ?, position = ? WHERE id = ?", links)
    conn.executemany("UPDATE conversations SET leaf_id = ? WHERE id = ?",
                     [(message_id, conv_id) for conv_id, (message_id, _) in last.items()])


def _v3_search_index(conn: sqlite3.Connection, name: str, table: str, column: str) -> None:
    """An external-content FTS5 table over ``table.column`` (no second copy of the text), kept in
    sync by triggers and filled from the rows already there."""
    conn.execute(f"CREATE VIRTUAL TABLE {name} USING fts5({column}, content='{table}', "
                 f"content_rowid='id', tokenize='unicode61 remove_diacritics 2')")
    add = f"INSERT INTO {name} (rowid, {column}) VALUES (new.id, new.{column})"
    drop = f"INSERT INTO {name} ({name}, rowid, {column}) VALUES ('delete', old.id, old.{column})"
    conn.execute(f"CREATE TRIGGER {name}_insert AFTER INSERT ON {table} BEGIN {add}; END")
    conn.execute(f"CREATE TRIGGER {name}_delete AFTER DELETE ON {table} BEGIN {drop}; END")
    conn.execute(f"CREATE TRIGGER {name}_update AFTER UPDATE OF {column} ON {table} "
                 f"BEGIN {drop}; {add}; END")
    conn.execute(f"INSERT INTO {name} ({name}) VALUES ('rebuild')")


def _v4_reply_model(conn: sqlite3.Connection) -> None:
    """Each reply remembers the model that wrote it (the page can switch models); replies stored
    before keep NULL: unknown."""
    conn.execute("ALTER TABLE messages ADD COLUMN model TEXT")


def _v5_revision(conn: sqlite3.Connection) -> None:
    """Each conversation counts its writes (``revision``), kept by triggers, so a page showing it
    notices a change made elsewhere (another tab, another app process) by reading one number.
    Every write counts: a streamed reply's updates too, which leave ``updated_at`` alone."""
    conn.execute("ALTER TABLE conversations ADD COLUMN revision INTEGER NOT NULL DEFAULT 0")
    bump = "UPDATE conversations SET revision = revision + 1 WHERE id = {row}.{column}"
    conn.execute("CREATE TRIGGER conversations_revised AFTER UPDATE OF title, settings, leaf_id, updated_at "
                 f"ON conversations BEGIN {bump.format(row='new', column='id')}; END")
    for event, row in (("INSERT", "new"), ("UPDATE", "new"), ("DELETE", "old")):
        conn.execute(f"CREATE TRIGGER messages_{event.lower()}_revise AFTER {event} ON messages "
                     f"BEGIN {bump.format(row=row, column='conversation_id')}; END")


# MIGRATIONS[v] takes a database from version v to v + 1. Append new steps; never edit old ones.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_tables, _v2_indexes, _v3_trees_and_search, _v4_reply_model,
                                                          _v5_revision]
SCHEMA_VERSION = len(MIGRATIONS)


# ----------------------------------------------------------------------------- the store

class ConversationStore:
    """Conversations on disk. Safe to share between threads; several processes may open one file."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            folder = data_dir()
            _private_folder(folder, tighten=True)  # the app's own folder
            path = folder / DB_NAME
        else:
            path = Path(path)
            _private_folder(path.parent, tighten=False)  # create privately; leave an existing one
        self.path = path
        self._lock = threading.Lock()  # one connection, used by one thread at a time
        _create_private_file(path)
        self._conn: sqlite3.Connection | None = _connect(path)
        try:
            _migrate(self._conn, path, SCHEMA_VERSION)
            for suffix in ("-wal", "-shm"):  # SQLite copies the file's mode; make sure
                _chmod_if_exists(Path(f"{path}{suffix}"), 0o600)
        except BaseException:
            self.close()
            raise

    # ---- lifecycle

    def close(self) -> None:
        """Close the connection (WAL is checkpointed). Further calls raise."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- conversations

    @staticmethod
    def default_settings() -> ChatSettings:
        """The settings a new conversation starts with (same as the module's function)."""
        return default_settings()

    def create(self, title: str = DEFAULT_TITLE, settings: ChatSettings | None = None,
               first_message: str | None = None) -> Conversation:
        """A new conversation; it becomes the most recently updated. ``first_message``: the user's
        message it starts with, stored in the same transaction (a failed store of it leaves no
        empty chat behind); None: the conversation starts empty."""
        title = _clean_title(title)
        settings = settings if settings is not None else default_settings()
        settings.validate()
        if first_message is not None:
            _check_message("user", first_message)
        now = time.time()
        with self._write() as conn:
            cur = conn.execute(
                f"INSERT INTO conversations (title, created_at, updated_at, settings) "
                f"VALUES (?, ?, {_NEWEST}, ?)",
                (title, now, now, json.dumps(settings.to_dict())))
            if first_message is not None:
                _add(conn, cur.lastrowid, None, "user", first_message, None)
            return _load(conn, _conversation_row(conn, cur.lastrowid))

    def get(self, conv_id: int) -> Conversation:
        """The conversation with the shown path (root to selected leaf) as ``messages``, each with
        its place among its versions; NotFoundError if there is none."""
        with self._read() as conn:
            return _load(conn, _conversation_row(conn, conv_id))

    def revision(self, conv_id: int) -> int:
        """How many writes the conversation has had (any change to it raises it); NotFoundError
        if there is none. One indexed read: a page asks it every second."""
        with self._read() as conn:
            return _conversation_row(conn, conv_id)["revision"]

    def heading(self, conv_id: int) -> Conversation:
        """The conversation without its messages (``messages`` is empty): its title, settings and
        revision in one indexed read, which a page makes every second; NotFoundError if there is none."""
        with self._read() as conn:
            return _conversation(_conversation_row(conn, conv_id), [])

    def rename(self, conv_id: int, title: str) -> None:
        """Retitle the conversation. Its place in the list and its time stay: they say when the
        chat was last written to, and a chat that jumped to the top when renamed would leave the
        user's pointer over another one (as in peer apps, renaming is not using)."""
        title = _clean_title(title)
        with self._write() as conn:
            _conversation_row(conn, conv_id)
            conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))

    def update_settings(self, conv_id: int, settings: ChatSettings) -> None:
        """Replace the conversation's settings; ValueError (nothing stored) if they are invalid.
        Like :meth:`rename`, it leaves the chat's place in the list and its time alone."""
        settings.validate()
        with self._write() as conn:
            _conversation_row(conn, conv_id)
            conn.execute("UPDATE conversations SET settings = ? WHERE id = ?",
                         (json.dumps(settings.to_dict()), conv_id))

    def delete(self, conv_id: int) -> None:
        """Delete the conversation and (by cascade) all its messages."""
        with self._write() as conn:
            # detached first, so the cascade is one level deep (see _delete_messages)
            conn.execute("UPDATE messages SET parent_id = NULL WHERE conversation_id = ?", (conv_id,))
            if conn.execute("DELETE FROM conversations WHERE id = ?", (conv_id,)).rowcount == 0:
                raise NotFoundError(f"no conversation with id {conv_id}")

    # ---- messages

    def append(self, conv_id: int, role: str, content: str, stats: StatsLike | None = None,
               model: str | None = None, leave_unanswered: bool = False) -> Message:
        """Add a message below the selected leaf and select it: the next turn of the shown chat.
        ``leave_unanswered``: the questions at the shown path's end (after its last reply) are
        marked as left unanswered first, in the same transaction (each mark was a write of its
        own: a failed append kept them)."""
        _check_message(role, content)
        stats_json = _stats_json(stats)
        with self._write() as conn:
            leaf = _conversation_row(conn, conv_id)["leaf_id"]
            if leave_unanswered:
                _mark_unanswered(conn, leaf)
            return _add(conn, conv_id, leaf, role, content, stats_json, model)

    def add_message(self, conv_id: int, parent_id: int | None, role: str, content: str,
                    stats: StatsLike | None = None, model: str | None = None) -> Message:
        """Add a child of ``parent_id`` (None: a new first message) and select it. Regenerate and
        edit pass the old message's parent: the new version is its sibling, the old one stays.
        ``model``: the model that writes a reply."""
        _check_message(role, content)
        stats_json = _stats_json(stats)
        with self._write() as conn:
            _conversation_row(conn, conv_id)
            if parent_id is not None:
                _message_row(conn, conv_id, parent_id)
            return _add(conn, conv_id, parent_id, role, content, stats_json, model)

    def update_message(self, message_id: int, content: str, stats: StatsLike | None = None,
                       model: str | None = None) -> None:
        """Replace a message's content, whatever its role (a streamed reply as it grows);
        ``stats=None`` keeps the stored stats, so only the final update needs to carry them
        (``model=None`` likewise keeps the stored model).

        The conversation's updated_at is left alone: the turn was dated when its reply was added,
        and a stream that re-dated its chat every half second would make two replying chats swap
        places in the sidebar under the user's pointer."""
        _check_message("assistant", content)
        with self._write() as conn:
            row = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no message with id {message_id}")
            conn.execute("UPDATE messages SET content = ?, stats = COALESCE(?, stats), model = COALESCE(?, model) WHERE id = ?",
                         (content, _stats_json(stats), model, message_id))

    def truncate_after(self, conv_id: int, position: int) -> None:
        """Drop everything below the shown path's message at ``position`` (every version, not
        only the shown one) and select that message; -1 drops every message. What a linear chat
        meant by "drop the messages after position"; branches that part above it are kept."""
        with self._write() as conn:
            _touch(conn, conv_id, time.time())
            path = _path_ids(conn, _conversation_row(conn, conv_id)["leaf_id"])
            if position >= len(path):
                return
            keep = path[position] if position >= 0 else None
            _delete_messages(conn, _descendants(conn, conv_id, keep))
            _set_leaf(conn, conv_id, keep)

    def select_message(self, conv_id: int, message_id: int) -> Conversation:
        """Show the path through ``message_id``; below it, the branch written to last (the path
        ends at the newest leaf under it). Navigation: the sidebar order does not change."""
        with self._write() as conn:
            _message_row(conn, conv_id, message_id)
            _set_leaf(conn, conv_id, _newest_leaf(conn, message_id))
            return _load(conn, _conversation_row(conn, conv_id))

    def switch_version(self, conv_id: int, message_id: int, step: int) -> Conversation:
        """Show the previous (``step`` -1) or next (+1) version of a message, i.e. its sibling,
        clamped to the first and last; below it as in :meth:`select_message`."""
        with self._write() as conn:
            row = _message_row(conn, conv_id, message_id)
            siblings = _sibling_ids(conn, conv_id, row["parent_id"])
            i = min(max(siblings.index(message_id) + int(step), 0), len(siblings) - 1)
            _set_leaf(conn, conv_id, _newest_leaf(conn, siblings[i]))
            return _load(conn, _conversation_row(conn, conv_id))

    def delete_message(self, conv_id: int, message_id: int) -> Conversation:
        """Delete a message and everything below it. If the shown path ran through it, it now runs
        through another version of it (the previous one, else the next), else ends at its parent."""
        with self._write() as conn:
            _touch(conn, conv_id, time.time())
            row = _message_row(conn, conv_id, message_id)
            leaf = _conversation_row(conn, conv_id)["leaf_id"]
            siblings = _sibling_ids(conn, conv_id, row["parent_id"])
            doomed = [message_id, *_descendants(conn, conv_id, message_id)]
            _delete_messages(conn, doomed)
            if leaf in set(doomed):
                i = siblings.index(message_id)
                others = siblings[:i][-1:] + siblings[i + 1:i + 2]  # the previous, else the next
                _set_leaf(conn, conv_id, _newest_leaf(conn, others[0]) if others else row["parent_id"])
            return _load(conn, _conversation_row(conn, conv_id))

    # ---- import, search and export

    def import_conversation(self, text: str | bytes) -> Conversation:
        """A new conversation from a file's text: our own export_json (its whole tree when it has
        one) or OpenAI-style messages, ``{"messages": [...]}`` or a bare list, where a leading
        system message becomes the system prompt. The file is checked whole before anything is
        stored; BadImportFile says what is wrong, and then nothing is. A title a chat already has
        gets " (imported)" (re-importing an export), so the sidebar tells the two apart."""
        plan = _plan_import(text)
        now = time.time()
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM conversations WHERE title = ?", (plan.title,)).fetchone():
                suffix = " (imported)"
                plan = replace(plan, title=plan.title[: IMPORT_TITLE_LIMIT - len(suffix)] + suffix)
            cur = conn.execute(
                f"INSERT INTO conversations (title, created_at, updated_at, settings) "
                f"VALUES (?, ?, {_NEWEST}, ?)",
                (plan.title, plan.created_at or now, now, json.dumps(plan.settings.to_dict())))
            conv_id = cur.lastrowid
            # one batch insert with the ids given here (a 100,000-message chat took 22 s row by
            # row): after every id used so far, as AUTOINCREMENT would give them; parents first
            (last,) = conn.execute("SELECT MAX(COALESCE((SELECT MAX(id) FROM messages), 0), COALESCE("
                                   "(SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0))").fetchone()
            new_ids: dict[int, tuple[int, int]] = {}  # key in the file -> (id, position) here
            rows = []
            for new_id, m in enumerate(plan.messages, start=last + 1):
                parent_id, parent_position = new_ids[m.parent] if m.parent is not None else (None, -1)
                new_ids[m.key] = (new_id, parent_position + 1)
                rows.append((new_id, conv_id, parent_id, parent_position + 1, m.role, m.content, m.created_at or now,
                             m.stats, m.model))
            conn.executemany("INSERT INTO messages (id, conversation_id, parent_id, position, role, content, created_at, "
                             "stats, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            _set_leaf(conn, conv_id, _newest_leaf(conn, new_ids[plan.leaf][0]))
            return _load(conn, _conversation_row(conn, conv_id))

    def search(self, query: str, limit: int = 50) -> list[ConversationSummary]:
        """Conversations whose title, or one of whose messages (in any branch), has every word of
        ``query``, the last word as a prefix (results while typing); most recently updated first.
        Any text is safe to pass: each word is quoted, so FTS5 syntax in it means nothing."""
        match = _fts_query(query)
        if match is None or limit < 1:
            return []
        with self._read() as conn:
            rows = conn.execute(
                "WITH hits AS (SELECT m.conversation_id, MAX(m.id) AS newest FROM messages_fts "
                "              JOIN messages m ON m.id = messages_fts.rowid "
                "              WHERE messages_fts MATCH :match GROUP BY m.conversation_id) "
                f"SELECT {_SUMMARY_COLUMNS}, hits.newest FROM conversations c "
                "LEFT JOIN hits ON hits.conversation_id = c.id "
                "WHERE hits.newest IS NOT NULL "
                "   OR c.id IN (SELECT rowid FROM conversations_fts WHERE conversations_fts MATCH :match) "
                "ORDER BY c.updated_at DESC, c.id DESC LIMIT :limit",
                {"match": match, "limit": int(limit)}).fetchall()
            return [_summary(r, _snippet(conn, match, r["newest"])) for r in rows]

    def export_markdown(self, conv_id: int) -> str:
        """The shown path as a Markdown document: title, system prompt, then each turn."""
        conv = self.get(conv_id)
        out = [f"# {conv.title}", "",
               f"_Exported from minisgl-chat, {_when(time.time())}. "
               f"Started {_when(conv.created_at)}._", ""]
        if conv.settings.system_prompt:
            out += ["**System prompt:**", "", _quote(conv.settings.system_prompt), ""]
        for m in conv.messages:
            out += [f"## {m.role.capitalize()}", "", m.content, ""]
            line = " · ".join(x for x in (m.model if m.role == "assistant" else None,
                                          m.stats.summary() if m.stats is not None else None) if x)
            if line:
                out += [f"_{line}_", ""]
        return "\n".join(out).rstrip() + "\n"

    def export_json(self, conv_id: int) -> str:
        """The conversation as JSON: title, settings, the shown path as ``messages`` (with stats),
        every version as ``tree`` (parents before children) with the selected ``leaf_id``, and the
        schema version. :meth:`import_conversation` reads it back, branches included."""
        with self._read() as conn:
            row = _conversation_row(conn, conv_id)
            conv = _load(conn, row)
            tree = conn.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY position, id",
                                (conv_id,)).fetchall()
        doc = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "id": conv.id,
            "title": conv.title,
            "created_at": conv.created_at,
            "updated_at": conv.updated_at,
            "settings": conv.settings.to_dict(),
            "messages": [
                {"id": m.id, "position": m.position, "role": m.role, "content": m.content,
                 "created_at": m.created_at, "stats": m.stats.to_dict() if m.stats else None, "model": m.model}
                for m in conv.messages
            ],
            "leaf_id": row["leaf_id"],
            "tree": [
                {"id": r["id"], "parent_id": r["parent_id"], "role": r["role"], "content": r["content"],
                 "created_at": r["created_at"], "stats": _stats_dict(r["stats"]), "model": r["model"]}
                for r in tree
            ],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)

    # Defined last: inside the class body the name `list` is this method from here on.
    def list(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first."""
        with self._read() as conn:
            rows = conn.execute(f"SELECT {_SUMMARY_COLUMNS} FROM conversations c "
                                "ORDER BY c.updated_at DESC, c.id DESC").fetchall()
        return [_summary(r) for r in rows]

    # ---- transactions

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. IMMEDIATE takes the write lock up front (waiting up to the busy
        timeout): a deferred one that reads first can fail at once when another writer commits."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: all its queries see the same snapshot."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the conversation store {self.path} is closed")
        return self._conn


# ----------------------------------------------------------------------------- helpers

# An updated_at later than every other conversation's, so the sidebar order follows the order of
# writes even when two land within the clock's resolution. Parameter: now.
_NEWEST = "MAX(?, COALESCE((SELECT MAX(updated_at) FROM conversations), 0) + 1e-6)"


def _touch(conn: sqlite3.Connection, conv_id: int, now: float) -> None:
    """Mark the conversation as just updated; NotFoundError (the transaction rolls back) if none."""
    cur = conn.execute(f"UPDATE conversations SET updated_at = {_NEWEST} WHERE id = ?", (now, conv_id))
    if cur.rowcount == 0:
        raise NotFoundError(f"no conversation with id {conv_id}")


# ----------------------------------------------------------------------------- the tree

# A summary row; message_count is the shown path's length, which is the leaf's depth + 1.
_SUMMARY_COLUMNS = ("c.id, c.title, c.created_at, c.updated_at, "
                    "COALESCE((SELECT position + 1 FROM messages WHERE id = c.leaf_id), 0) AS n")

# The messages from the root down to a given one. Parameter: its id.
_PATH_SQL = """
    WITH RECURSIVE path(id, depth) AS (
        SELECT ?, 0
        UNION ALL
        SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
        WHERE m.parent_id IS NOT NULL)
    SELECT m.* FROM path JOIN messages m ON m.id = path.id ORDER BY path.depth DESC"""


def _conversation_row(conn: sqlite3.Connection, conv_id: int) -> sqlite3.Row:
    row = conn.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no conversation with id {conv_id}")
    return row


def _message_row(conn: sqlite3.Connection, conv_id: int, message_id: int) -> sqlite3.Row:
    """The message, which must belong to the conversation; NotFoundError otherwise."""
    _conversation_row(conn, conv_id)
    row = conn.execute("SELECT * FROM messages WHERE id = ? AND conversation_id = ?",
                       (message_id, conv_id)).fetchone()
    if row is None:
        raise NotFoundError(f"no message with id {message_id} in conversation {conv_id}")
    return row


def _load(conn: sqlite3.Connection, row: sqlite3.Row) -> Conversation:
    """The conversation with its shown path; each message learns its versions from the ids and
    parents of the whole tree (small: no text is read for branches not shown)."""
    if row["leaf_id"] is None:
        return _conversation(row, [])
    path = conn.execute(_PATH_SQL, (row["leaf_id"],)).fetchall()
    versions: dict[int | None, list[int]] = {}
    for message_id, parent_id in conn.execute(
            "SELECT id, parent_id FROM messages WHERE conversation_id = ? ORDER BY id", (row["id"],)):
        versions.setdefault(parent_id, []).append(message_id)
    return _conversation(row, [_message(r, versions[r["parent_id"]]) for r in path])


def _path_ids(conn: sqlite3.Connection, leaf_id: int | None) -> list[int]:
    return [] if leaf_id is None else [r["id"] for r in conn.execute(_PATH_SQL, (leaf_id,))]


def _sibling_ids(conn: sqlite3.Connection, conv_id: int, parent_id: int | None) -> list[int]:
    """The versions below ``parent_id`` (None: the first messages), oldest first."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
        (conv_id, parent_id))]


def _descendants(conn: sqlite3.Connection, conv_id: int, message_id: int | None) -> list[int]:
    """Every message below ``message_id`` (None: every message of the conversation)."""
    return [r[0] for r in conn.execute(
        "WITH RECURSIVE below(id) AS ("
        "    SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ?"
        "    UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id) "
        "SELECT id FROM below", (conv_id, message_id))]


def _newest_leaf(conn: sqlite3.Connection, message_id: int) -> int:
    """The most recently created message without children at or below ``message_id``: where the
    branch through it was last written to."""
    return conn.execute(
        "WITH RECURSIVE below(id) AS ("
        "    SELECT ? UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id) "
        "SELECT MAX(id) FROM below "
        "WHERE NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = below.id)",
        (message_id,)).fetchone()[0]


def _set_leaf(conn: sqlite3.Connection, conv_id: int, leaf_id: int | None) -> None:
    conn.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf_id, conv_id))


def _insert(conn: sqlite3.Connection, conv_id: int, parent_id: int | None, position: int, role: str,
            content: str, created_at: float, stats_json: str | None, model: str | None = None) -> int:
    cur = conn.execute(
        "INSERT INTO messages (conversation_id, parent_id, position, role, content, created_at, stats, model) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (conv_id, parent_id, position, role, content, created_at, stats_json, model))
    return cur.lastrowid


# The questions at the end of the path to a message, after its last reply: the walk up from it
# goes on only through questions; it reads their id and stats, not their text (it runs on every
# send, inside the write lock). Parameter: the message's id.
_TRAILING_QUESTIONS_SQL = """
    WITH RECURSIVE tail(id, parent_id, role, stats) AS (
        SELECT id, parent_id, role, stats FROM messages WHERE id = ?
        UNION ALL
        SELECT m.id, m.parent_id, m.role, m.stats FROM messages m JOIN tail ON m.id = tail.parent_id
        WHERE tail.role = 'user')
    SELECT id, stats FROM tail WHERE role = 'user'"""


def _mark_unanswered(conn: sqlite3.Connection, leaf_id: int | None) -> None:
    """Mark the questions at the end of the path to ``leaf_id``, after its last reply, as left
    unanswered (their other stats kept)."""
    for row in conn.execute(_TRAILING_QUESTIONS_SQL, (leaf_id,)).fetchall() if leaf_id is not None else []:
        stats = _stats_dict(row["stats"]) or {}
        if not stats.get("unanswered"):
            conn.execute("UPDATE messages SET stats = ? WHERE id = ?", (_stats_json({**stats, "unanswered": True}), row["id"]))


def _add(conn: sqlite3.Connection, conv_id: int, parent_id: int | None, role: str, content: str,
         stats_json: str | None, model: str | None = None) -> Message:
    """Insert a child of ``parent_id`` and select it; the message as stored, with its versions."""
    now = time.time()
    _touch(conn, conv_id, now)
    parent = conn.execute("SELECT position FROM messages WHERE id = ?", (parent_id,)).fetchone()
    message_id = _insert(conn, conv_id, parent_id, parent[0] + 1 if parent else 0, role, content,
                         now, stats_json, model)
    _set_leaf(conn, conv_id, message_id)
    row = conn.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
    return _message(row, _sibling_ids(conn, conv_id, parent_id))


def _delete_messages(conn: sqlite3.Connection, ids: list[int]) -> None:
    """Delete these messages (whole subtrees). Each is detached from its parent first: deleting
    a root would otherwise cascade one trigger level per generation, and SQLite stops at 1000."""
    rows = [(i,) for i in ids]
    conn.executemany("UPDATE messages SET parent_id = NULL WHERE id = ?", rows)
    conn.executemany("DELETE FROM messages WHERE id = ?", rows)


# ----------------------------------------------------------------------------- search

def _fts_query(text: str) -> str | None:
    """An FTS5 query for every word of ``text``, the last one as a prefix; None if it has no word.
    Each word is one quoted string, so quotes, ``*``, ``AND``, ``NEAR(`` and the like are text."""
    words = [w for w in str(text).split() if any(ch.isalnum() for ch in w)]
    if not words:
        return None
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    return " ".join(quoted) + "*"


def _snippet(conn: sqlite3.Connection, match: str, message_id: int | None) -> str:
    """A few words around the match in a matching message ("" for None: only the title matched).
    Looked up by rowid: one message, not every hit of a common word."""
    if message_id is None:
        return ""
    row = conn.execute("SELECT snippet(messages_fts, 0, '', '', '…', ?) FROM messages_fts "
                       "WHERE messages_fts MATCH ? AND rowid = ?",
                       (SNIPPET_TOKENS, match, message_id)).fetchone()
    return row[0] if row else ""


def _summary(row: sqlite3.Row, snippet: str = "") -> ConversationSummary:
    return ConversationSummary(row["id"], row["title"], row["created_at"], row["updated_at"], row["n"],
                               snippet)


# ----------------------------------------------------------------------------- import

@dataclass(frozen=True)
class _Imported:
    """A message read from an import file, before it has an id here."""

    role: str
    content: str
    created_at: float | None
    stats: str | None  # as stored: MessageStats as JSON
    key: int = 0  # its id in the file's tree, or its index in a list
    parent: int | None = None  # its parent's key
    model: str | None = None  # the model that wrote a reply (our export's "model")


@dataclass(frozen=True)
class _ImportPlan:
    """A whole import file, checked: what import_conversation stores in one transaction."""

    title: str
    settings: ChatSettings
    created_at: float | None
    messages: list[_Imported]  # parents before children
    leaf: int  # key of the message to show the path to


def _plan_import(text: str | bytes) -> _ImportPlan:
    """Read and check an import file; BadImportFile names the first problem."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > IMPORT_LIMIT_BYTES:
            raise _too_big(len(text))
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadImportFile(f"not UTF-8 text: byte {e.start + 1} (0x{text[e.start]:02x}) cannot be "
                                "read; save the file as UTF-8") from None
    elif not isinstance(text, str):
        raise TypeError(f"import_conversation takes text or bytes (got {type(text).__name__})")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > IMPORT_LIMIT_BYTES:
        raise _too_big(size)
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise BadImportFile("the file is empty")  # json's "Expecting value at line 1 column 1" said less
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadImportFile(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise BadImportFile("not JSON that can be read: it is nested too deeply") from None
    if isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT:
        return _plan_ours(doc)
    if isinstance(doc, dict) and "messages" in doc:
        return _plan_openai(doc["messages"], doc.get("title"))
    if isinstance(doc, list):
        return _plan_openai(doc, None)
    raise BadImportFile('expected a minisgl-chat export, an object with a "messages" list, '
                        f"or a list of messages; got {_kind(doc)}")


def _too_big(size: int) -> BadImportFile:
    return BadImportFile(f"the file is {size / 1e6:.1f} MB; the limit is {IMPORT_LIMIT_BYTES / 1e6:.0f} MB")


def _plan_ours(doc: dict[str, Any]) -> _ImportPlan:
    """Our own export: the tree and its selected leaf if the file has them (schema 3 on), else
    the messages as one branch (what schemas 1 and 2 wrote)."""
    settings = doc.get("settings", {})
    if not isinstance(settings, dict):
        raise BadImportFile(f"settings: expected an object, got {_kind(settings)}")
    settings = _checked_settings(ChatSettings.from_dict(settings), "settings")
    if "tree" in doc:
        messages, leaf = _read_tree(doc["tree"], doc.get("leaf_id"))
    else:
        messages = _chain(_read_messages(doc.get("messages"), "messages"))
        leaf = len(messages) - 1
    created_at = doc.get("created_at")
    return _ImportPlan(_import_title(doc.get("title"), messages), settings,
                       float(created_at) if _is_number(created_at) else None, messages, leaf)


def _plan_openai(items: object, title: object) -> _ImportPlan:
    """OpenAI-style messages; a leading system message becomes the system prompt."""
    parsed = _read_messages(items, "messages")
    system_prompt = parsed.pop(0).content if parsed and parsed[0].role == "system" else ""
    settings = _checked_settings(replace(default_settings(), system_prompt=system_prompt), "messages[0]")
    messages = _chain(parsed)
    return _ImportPlan(_import_title(title, messages), settings, None, messages, len(messages) - 1)


def _read_messages(items: object, where: str) -> list[_Imported]:
    if not isinstance(items, list):
        raise BadImportFile(f"{where}: expected a list of messages, got {_kind(items)}")
    if not items:
        raise BadImportFile("no messages to import")
    return [_read_message(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _chain(messages: list[_Imported]) -> list[_Imported]:
    """A list of messages as one branch: each the child of the one before."""
    if not messages:
        raise BadImportFile("no messages to import")
    return [_Imported(m.role, m.content, m.created_at, m.stats, i, i - 1 if i else None, m.model)
            for i, m in enumerate(messages)]


def _read_tree(tree: object, leaf_id: object) -> tuple[list[_Imported], int]:
    """Our export's ``tree``: every parent must come before its children (as we write it)."""
    if not isinstance(tree, list):
        raise BadImportFile(f"tree: expected a list of messages, got {_kind(tree)}")
    out: list[_Imported] = []
    seen: set[int] = set()
    for i, item in enumerate(tree):
        where = f"tree[{i}]"
        message = _read_message(item, where)
        key, parent = item.get("id"), item.get("parent_id")
        if not _is_id(key):
            raise BadImportFile(f"{where}.id: expected a whole number, got {shown_value(key)}")
        if key in seen:
            raise BadImportFile(f"{where}.id: {key} is also the id of an earlier message")
        if parent is not None and (not _is_id(parent) or parent not in seen):
            raise BadImportFile(f"{where}.parent_id: {shown_value(parent)} is not the id of an earlier message")
        seen.add(key)
        out.append(replace(message, key=key, parent=parent))
    if not out:
        raise BadImportFile("no messages to import")
    if leaf_id is None:
        return out, out[-1].key  # listed after its parents, so it has no children
    if not _is_id(leaf_id) or leaf_id not in seen:
        raise BadImportFile(f"leaf_id: {shown_value(leaf_id)} is not the id of a message in the tree")
    return out, leaf_id


def _read_message(item: object, where: str) -> _Imported:
    """One message of a list or a tree: role and content, and the created_at and stats we write."""
    if not isinstance(item, dict):
        raise BadImportFile(f"{where}: expected an object with role and content, got {_kind(item)}")
    for key in ("role", "content"):
        if key not in item:
            raise BadImportFile(f"{where}.{key} is missing")
    role = item["role"]
    if not isinstance(role, str) or role not in ROLES:
        raise BadImportFile(f"{where}.role: {shown_value(role)} is not one of {', '.join(ROLES)}")
    created_at = item.get("created_at")
    model = item.get("model")
    if model is not None and not isinstance(model, str):
        raise BadImportFile(f"{where}.model: expected text or null, got {_kind(model)}")
    return _Imported(role, _content_text(item["content"], f"{where}.content"),
                     float(created_at) if _is_number(created_at) else None,
                     _read_stats(item.get("stats"), f"{where}.stats"), model=model)


def _content_text(content: object, where: str) -> str:
    """Text, or OpenAI's list of parts of which only text ones can be imported (joined by lines)."""
    if isinstance(content, str):
        return _checked_text(content, where)
    if not isinstance(content, list):
        raise BadImportFile(f"{where}: expected text or a list of text parts, got {_kind(content)}")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise BadImportFile(f'{where}[{i}]: expected a part like {{"type": "text", "text": "..."}}, '
                                f"got {_kind(part)}")
        if part.get("type") != "text":
            raise BadImportFile(f"{where}[{i}].type: only text parts can be imported, "
                                f"not {shown_value(part.get('type'))}")
        if not isinstance(part.get("text"), str):
            raise BadImportFile(f"{where}[{i}].text: expected text, got {_kind(part.get('text'))}")
        texts.append(part["text"])
    return _checked_text("\n".join(texts), where)


def _checked_text(text: str, where: str) -> str:
    """Text SQLite can store as UTF-8: JSON may carry half a surrogate pair ("\\ud83d", a cut emoji)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadImportFile(f"{where}: character {e.start + 1} is {ascii(text[e.start])}, half of a "
                            "character pair (a cut emoji?); remove it") from None
    return text


# What each stats field may hold in an import file (null is always allowed).
_STATS_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "ttft_ms": (lambda v: _is_number(v), "a number"),  # late-bound: defined below
    "tok_s": (lambda v: _is_number(v), "a number"),
    "tokens": (lambda v: _is_id(v) and v >= 0, "a whole number"),
    "finish_reason": (lambda v: isinstance(v, str), "text"),
    "stopped": (lambda v: isinstance(v, bool), "true or false"),
    "stopped_by": (lambda v: isinstance(v, str), "text"),
    "unanswered": (lambda v: isinstance(v, bool), "true or false"),
}


def _read_stats(value: object, where: str) -> str | None:
    """Stats as stored, or None; unknown keys are dropped (other versions' files), wrong types
    refused (the UI formats these numbers)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadImportFile(f"{where}: expected an object or null, got {_kind(value)}")
    for name, (ok, wanted) in _STATS_KINDS.items():
        v = value.get(name)
        if v is not None and not ok(v):
            raise BadImportFile(f"{where}.{name}: expected {wanted}, got {shown_value(v)}")
    stats = MessageStats.from_dict(value)
    return json.dumps(replace(stats, stopped=bool(stats.stopped), unanswered=bool(stats.unanswered)).to_dict())


def _checked_settings(settings: ChatSettings, where: str) -> ChatSettings:
    try:
        settings.validate()
    except ValueError as e:
        raise BadImportFile(f"{where}: {e}") from None
    return settings


def _import_title(title: object, messages: list[_Imported]) -> str:
    """The file's title, else one from the first user message; at most IMPORT_TITLE_LIMIT chars."""
    if title is not None and not isinstance(title, str):
        raise BadImportFile(f"title: expected text, got {_kind(title)}")
    text = " ".join(_checked_text(title or "", "title").split())
    if not text:
        text = title_from(next((m.content for m in messages if m.role == "user"), ""))
    return text if len(text) <= IMPORT_TITLE_LIMIT else text[:IMPORT_TITLE_LIMIT - 1] + "…"


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _kind(value: object) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"


def plural(noun: str, n: int) -> str:
    """``noun`` as it follows the number ``n``: "1 token", "120 tokens"."""
    return noun if n == 1 else noun + "s"


def shown_value(value: object) -> str:
    """A value quoted for an error message, cut short; a number as people write it (5, not 5.0;
    40,000; 1e+20, not its 21 digits)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if abs(value) >= 1e15:
            return f"{value:.3g}"
        if isinstance(value, int) or value.is_integer():
            return f"{int(value):,}"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


# ----------------------------------------------------------------------------- the file


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; _write/_read/_migrate open them explicitly.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _migrate(conn: sqlite3.Connection, path: Path, target: int) -> None:
    """Bring the file to ``target`` in one transaction, or refuse a file from a newer version."""
    if _user_version(conn) > target:
        raise _too_new(path, _user_version(conn), target)
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
        raise RuntimeError(f"{path}: SQLite could not switch to WAL mode")
    conn.execute("PRAGMA synchronous = NORMAL")  # with WAL: atomic and consistent, fewer fsyncs
    if _user_version(conn) == target:
        return
    conn.execute("BEGIN IMMEDIATE")  # another process may be migrating: look again under the lock
    try:
        version = _user_version(conn)
        if version > target:
            raise _too_new(path, version, target)
        for step in MIGRATIONS[version:target]:
            step(conn)
        conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # some errors (disk full, I/O) have rolled back already
        conn.execute("ROLLBACK")


def _user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _too_new(path: Path, version: int, known: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"{path} has schema version {version}, but this minisgl-chat knows versions up to {known}; "
        f"upgrade minisgl-chat, or set {DATA_DIR_ENV} to another folder")


def _private_folder(folder: Path, tighten: bool) -> None:
    """Create ``folder`` as 0700; with ``tighten``, also take group/other access off an existing one."""
    existed = folder.is_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if tighten or not existed:
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask; this is exact


def _create_private_file(path: Path) -> None:
    """Create the database file as 0600 before SQLite opens it (SQLite would use 0644 & ~umask)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)  # an existing file with a looser mode, too


def _chmod_if_exists(path: Path, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except FileNotFoundError:
        pass


def _clean_title(title: str) -> str:
    title = " ".join(str(title).split())
    if not title:
        raise ValueError("a conversation title cannot be empty")
    return title


def _check_message(role: str, content: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)} (got {role!r})")
    if not isinstance(content, str):
        raise TypeError(f"message content must be a str (got {type(content).__name__})")


def _is_whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _stats_json(stats: StatsLike | None) -> str | None:
    if stats is None:
        return None
    if isinstance(stats, Mapping):
        stats = MessageStats(**stats)  # unknown keys are a TypeError, not silently stored
    return json.dumps(stats.to_dict())


def _stats_dict(stats_json: str | None) -> dict[str, Any] | None:
    return MessageStats.from_dict(json.loads(stats_json)).to_dict() if stats_json is not None else None


def _message(row: sqlite3.Row, siblings: list[int] | None = None) -> Message:
    """A message from its row; ``siblings``: the ids of its versions, oldest first."""
    stats = MessageStats.from_dict(json.loads(row["stats"])) if row["stats"] is not None else None
    siblings = siblings or [row["id"]]
    return Message(row["id"], row["conversation_id"], row["position"], row["role"], row["content"],
                   row["created_at"], stats, row["parent_id"], siblings.index(row["id"]), len(siblings), row["model"])


def _conversation(row: sqlite3.Row, messages: list[Message]) -> Conversation:
    settings = ChatSettings.from_dict(json.loads(row["settings"]))
    return Conversation(row["id"], row["title"], row["created_at"], row["updated_at"], settings, messages, row["revision"])


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())
