"""The conversation store: chats, their messages and per-conversation settings in one SQLite file.

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
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import platformdirs

APP_NAME = "minisgl-chat"
DATA_DIR_ENV = "MINISGL_DATA_DIR"
DB_NAME = "chats.sqlite3"
DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 48
ROLES = ("user", "assistant", "system")
MAX_TOKENS_LIMIT = 32768
SYSTEM_PROMPT_LIMIT = 20_000
BUSY_TIMEOUT_S = 30.0


class NotFoundError(KeyError):
    """No conversation or message with that id (deleted, or never created)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else "not found"


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer minisgl-chat than this one."""


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation generation settings."""

    system_prompt: str = ""
    temperature: float = 0.3
    top_p: float = 0.9
    max_tokens: int = 512
    thinking: bool = False

    def validate(self) -> None:
        """Raise ValueError naming every invalid value, in words a user can act on."""
        problems = []
        if not isinstance(self.system_prompt, str):
            problems.append("system prompt must be text")
        elif len(self.system_prompt) > SYSTEM_PROMPT_LIMIT:
            problems.append(f"system prompt is {len(self.system_prompt):,} characters; "
                            f"the limit is {SYSTEM_PROMPT_LIMIT:,}")
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            problems.append(f"temperature must be between 0 and 2 (got {self.temperature!r})")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            problems.append(f"top-p must be greater than 0 and at most 1 (got {self.top_p!r})")
        if (not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool)
                or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT):
            problems.append(f"max tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT} "
                            f"(got {self.max_tokens!r})")
        if not isinstance(self.thinking, bool):
            problems.append(f"thinking must be on or off (got {self.thinking!r})")
        if problems:
            raise ValueError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatSettings:
        """Known keys only; missing keys take their defaults (files written by other versions)."""
        return cls(**_known_fields(cls, data))


@dataclass(frozen=True)
class MessageStats:
    """What the UI shows under a reply; ``stopped`` is set when the user pressed Stop."""

    ttft_ms: float | None = None
    tok_s: float | None = None
    tokens: int | None = None
    finish_reason: str | None = None
    stopped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MessageStats:
        return cls(**_known_fields(cls, data))


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    position: int  # 0, 1, 2, ... within the conversation
    role: str  # 'user' | 'assistant' | 'system'
    content: str
    created_at: float  # unix seconds
    stats: MessageStats | None = None


@dataclass(frozen=True)
class ConversationSummary:
    """One row of the sidebar."""

    id: int
    title: str
    created_at: float
    updated_at: float
    message_count: int


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    settings: ChatSettings
    messages: list[Message] = field(default_factory=list)


# Stats may be given as a MessageStats or a dict with the same keys; they are read back as MessageStats.
StatsLike = MessageStats | Mapping[str, Any]


def default_settings() -> ChatSettings:
    """The settings a new conversation starts with."""
    return ChatSettings()


def title_from(text: str) -> str:
    """A sidebar title from a first user message: its first non-blank line, at most ~48 chars."""
    line = next((" ".join(ln.split()) for ln in text.splitlines() if ln.strip()), "")
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


# MIGRATIONS[v] takes a database from version v to v + 1. Append new steps; never edit old ones.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1_tables, _v2_indexes]
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

    def create(self, title: str = DEFAULT_TITLE, settings: ChatSettings | None = None) -> Conversation:
        """A new, empty conversation; it becomes the most recently updated."""
        title = _clean_title(title)
        settings = settings if settings is not None else default_settings()
        settings.validate()
        now = time.time()
        with self._write() as conn:
            cur = conn.execute(
                f"INSERT INTO conversations (title, created_at, updated_at, settings) "
                f"VALUES (?, ?, {_NEWEST}, ?)",
                (title, now, now, json.dumps(settings.to_dict())))
            row = conn.execute("SELECT * FROM conversations WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _conversation(row, [])

    def get(self, conv_id: int) -> Conversation:
        """The conversation with its messages in order; NotFoundError if there is none."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no conversation with id {conv_id}")
            rows = conn.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY position",
                                (conv_id,)).fetchall()
        return _conversation(row, [_message(r) for r in rows])

    def rename(self, conv_id: int, title: str) -> None:
        title = _clean_title(title)
        with self._write() as conn:
            _touch(conn, conv_id, time.time())
            conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))

    def update_settings(self, conv_id: int, settings: ChatSettings) -> None:
        """Replace the conversation's settings; ValueError (nothing stored) if they are invalid."""
        settings.validate()
        with self._write() as conn:
            _touch(conn, conv_id, time.time())
            conn.execute("UPDATE conversations SET settings = ? WHERE id = ?",
                         (json.dumps(settings.to_dict()), conv_id))

    def delete(self, conv_id: int) -> None:
        """Delete the conversation and (by cascade) its messages."""
        with self._write() as conn:
            if conn.execute("DELETE FROM conversations WHERE id = ?", (conv_id,)).rowcount == 0:
                raise NotFoundError(f"no conversation with id {conv_id}")

    # ---- messages

    def append(self, conv_id: int, role: str, content: str, stats: StatsLike | None = None) -> Message:
        """Add a message after the last one; its position is assigned under the write lock."""
        _check_message(role, content)
        now = time.time()
        with self._write() as conn:
            _touch(conn, conv_id, now)
            cur = conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, created_at, stats) "
                "SELECT ?, COALESCE(MAX(position), -1) + 1, ?, ?, ?, ? "
                "FROM messages WHERE conversation_id = ?",
                (conv_id, role, content, now, _stats_json(stats), conv_id))
            row = conn.execute("SELECT * FROM messages WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _message(row)

    def update_message(self, message_id: int, content: str, stats: StatsLike | None = None) -> None:
        """Replace a message's content (a streamed reply as it grows); ``stats=None`` keeps the
        stored stats, so only the final update needs to carry them."""
        _check_message("assistant", content)
        with self._write() as conn:
            row = conn.execute("SELECT conversation_id FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no message with id {message_id}")
            _touch(conn, row["conversation_id"], time.time())
            conn.execute("UPDATE messages SET content = ?, stats = COALESCE(?, stats) WHERE id = ?",
                         (content, _stats_json(stats), message_id))

    def truncate_after(self, conv_id: int, position: int) -> None:
        """Drop every message after ``position`` (regenerate, edit-and-resend); -1 drops all."""
        with self._write() as conn:
            _touch(conn, conv_id, time.time())
            conn.execute("DELETE FROM messages WHERE conversation_id = ? AND position > ?",
                         (conv_id, position))

    # ---- export

    def export_markdown(self, conv_id: int) -> str:
        """The conversation as a Markdown document: title, system prompt, then each turn."""
        conv = self.get(conv_id)
        out = [f"# {conv.title}", "",
               f"_Exported from minisgl-chat, {_when(time.time())}. "
               f"Started {_when(conv.created_at)}._", ""]
        if conv.settings.system_prompt:
            out += ["**System prompt:**", "", _quote(conv.settings.system_prompt), ""]
        for m in conv.messages:
            out += [f"## {m.role.capitalize()}", "", m.content, ""]
            if m.stats is not None:
                out += [f"_{_stats_line(m.stats)}_", ""]
        return "\n".join(out).rstrip() + "\n"

    def export_json(self, conv_id: int) -> str:
        """The conversation as JSON: title, settings, messages (with stats) and schema version."""
        conv = self.get(conv_id)
        doc = {
            "format": "minisgl-chat conversation",
            "schema_version": SCHEMA_VERSION,
            "id": conv.id,
            "title": conv.title,
            "created_at": conv.created_at,
            "updated_at": conv.updated_at,
            "settings": conv.settings.to_dict(),
            "messages": [
                {"position": m.position, "role": m.role, "content": m.content,
                 "created_at": m.created_at, "stats": m.stats.to_dict() if m.stats else None}
                for m in conv.messages
            ],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)

    # Defined last: inside the class body the name `list` is this method from here on.
    def list(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT c.id, c.title, c.created_at, c.updated_at, "
                "       (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS n "
                "FROM conversations c ORDER BY c.updated_at DESC, c.id DESC").fetchall()
        return [ConversationSummary(r["id"], r["title"], r["created_at"], r["updated_at"], r["n"])
                for r in rows]

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


def _message(row: sqlite3.Row) -> Message:
    stats = MessageStats.from_dict(json.loads(row["stats"])) if row["stats"] is not None else None
    return Message(row["id"], row["conversation_id"], row["position"], row["role"], row["content"],
                   row["created_at"], stats)


def _conversation(row: sqlite3.Row, messages: list[Message]) -> Conversation:
    settings = ChatSettings.from_dict(json.loads(row["settings"]))
    return Conversation(row["id"], row["title"], row["created_at"], row["updated_at"], settings, messages)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


def _stats_line(s: MessageStats) -> str:
    parts = []
    if s.ttft_ms is not None:
        parts.append(f"first token {s.ttft_ms:.0f} ms")
    if s.tok_s is not None:
        parts.append(f"{s.tok_s:.1f} tok/s")
    if s.tokens is not None:
        parts.append(f"{s.tokens} tokens")
    if s.stopped:
        parts.append("stopped")
    elif s.finish_reason:
        parts.append(f"finished: {s.finish_reason}")
    return " · ".join(parts)
