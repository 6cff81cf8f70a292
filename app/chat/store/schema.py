"""The tables and their versions.

A conversation is a tree of messages: each message has a parent (none for a first message), and
regenerating or editing adds a sibling instead of overwriting, so every version is kept. The chat
shown is the path from the root to the conversation's selected leaf (``leaf_id``); ``position``
is a message's depth in the tree, so on that path it is 0, 1, 2, ... as in a linear chat. An FTS5
index over titles and message text, kept in sync by triggers, serves search.

The file carries its schema version in ``PRAGMA user_version`` and runs in WAL mode. Opening an
older file migrates it in one transaction (a failed step leaves it as it was); a newer one is
refused. ``MIGRATIONS[v]`` takes a file from version v to v + 1: a step, and every helper it
calls, is part of the version it makes, so it is never edited once released; a change to the
tables is a new step appended to the list.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from .database import DATA_DIR_ENV, rollback


class SchemaTooNewError(RuntimeError):
    """The database was written by a newer minisgl-chat than this one."""


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
    """Messages become trees (each linear chat one branch) and titles and text get an FTS5 index."""
    conn.execute("DROP INDEX messages_by_position")  # versions share a depth now
    # ALTER TABLE keeps the rows (rebuilding the table would need foreign keys off, which cannot
    # change inside this transaction); a REFERENCES column may be added as its default is NULL.
    conn.execute(
        "ALTER TABLE messages ADD COLUMN "
        "parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE"
    )
    conn.execute(
        "ALTER TABLE conversations ADD COLUMN "
        "leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL"
    )
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
    rows = conn.execute(
        "SELECT id, conversation_id FROM messages ORDER BY conversation_id, position, id"
    ).fetchall()
    last: dict[int, tuple[int, int]] = {}  # conversation -> (id, position) of its last message
    links = []
    for message_id, conv_id in rows:
        parent, parent_position = last.get(conv_id, (None, -1))
        last[conv_id] = (message_id, parent_position + 1)
        links.append((parent, parent_position + 1, message_id))
    conn.executemany("UPDATE messages SET parent_id = ?, position = ? WHERE id = ?", links)
    conn.executemany(
        "UPDATE conversations SET leaf_id = ? WHERE id = ?",
        [(message_id, conv_id) for conv_id, (message_id, _) in last.items()],
    )


def _v3_search_index(conn: sqlite3.Connection, name: str, table: str, column: str) -> None:
    """An external-content FTS5 table over ``table.column`` (no second copy of the text), kept in
    sync by triggers and filled from the rows already there."""
    conn.execute(
        f"CREATE VIRTUAL TABLE {name} USING fts5({column}, content='{table}', "
        f"content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
    )
    add = f"INSERT INTO {name} (rowid, {column}) VALUES (new.id, new.{column})"
    drop = f"INSERT INTO {name} ({name}, rowid, {column}) VALUES ('delete', old.id, old.{column})"
    conn.execute(f"CREATE TRIGGER {name}_insert AFTER INSERT ON {table} BEGIN {add}; END")
    conn.execute(f"CREATE TRIGGER {name}_delete AFTER DELETE ON {table} BEGIN {drop}; END")
    conn.execute(
        f"CREATE TRIGGER {name}_update AFTER UPDATE OF {column} ON {table} BEGIN {drop}; {add}; END"
    )
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
    conn.execute(
        "CREATE TRIGGER conversations_revised AFTER UPDATE OF title, settings, leaf_id, updated_at "
        f"ON conversations BEGIN {bump.format(row='new', column='id')}; END"
    )
    for event, row in (("INSERT", "new"), ("UPDATE", "new"), ("DELETE", "old")):
        conn.execute(
            f"CREATE TRIGGER messages_{event.lower()}_revise AFTER {event} ON messages "
            f"BEGIN {bump.format(row=row, column='conversation_id')}; END"
        )


def _v6_tools(conn: sqlite3.Connection) -> None:
    """MCP tools: the servers the user added (the Tools panel), and each reply's tool calls
    (records.ToolCallRecord as JSON, NULL: none)."""
    conn.execute("""
        CREATE TABLE mcp_servers (
            id         INTEGER PRIMARY KEY AUTOINCREMENT,
            name       TEXT NOT NULL UNIQUE,
            spec       TEXT NOT NULL,           -- {"command", "args", "env"} or {"url"} as JSON
            created_at REAL NOT NULL
        )""")
    conn.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT")


# MIGRATIONS[v] takes a database from version v to v + 1. Append new steps; never edit old ones.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_tables,
    _v2_indexes,
    _v3_trees_and_search,
    _v4_reply_model,
    _v5_revision,
    _v6_tools,
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: Path, target: int = SCHEMA_VERSION) -> None:
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
        rollback(conn)
        raise


def _user_version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _too_new(path: Path, version: int, known: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"{path} has schema version {version}, but this minisgl-chat knows versions up to {known}; "
        f"upgrade minisgl-chat, or set {DATA_DIR_ENV} to another folder"
    )
