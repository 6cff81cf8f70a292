"""Queries on a conversation's tree of messages, each inside a transaction the caller holds.

The chat shown is the path from a root message to the conversation's selected leaf; a message's
versions are its siblings (the children of its parent), oldest first. The store's mixins call
these through the module (``tree.add``, not a bare ``add``): the call says where the query lives,
and a test that replaces one (a write that fails) replaces it for every caller.
"""

from __future__ import annotations

import sqlite3
import time

from .records import Conversation, Message, NotFoundError, stats_dict, stats_json
from .rows import conversation_from_row, message_from_row

# An updated_at later than every other conversation's, so the sidebar order follows the order of
# writes even when two land within the clock's resolution. Parameter: now.
NEWEST = "MAX(?, COALESCE((SELECT MAX(updated_at) FROM conversations), 0) + 1e-6)"

# The messages from the root down to a given one. Parameter: its id.
_PATH_SQL = """
    WITH RECURSIVE path(id, depth) AS (
        SELECT ?, 0
        UNION ALL
        SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
        WHERE m.parent_id IS NOT NULL)
    SELECT m.* FROM path JOIN messages m ON m.id = path.id ORDER BY path.depth DESC"""

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


def touch(conn: sqlite3.Connection, conv_id: int, now: float) -> None:
    """Mark the conversation as just updated; NotFoundError (the transaction rolls back) if none."""
    cur = conn.execute(
        f"UPDATE conversations SET updated_at = {NEWEST} WHERE id = ?", (now, conv_id)
    )
    if cur.rowcount == 0:
        raise NotFoundError(f"no conversation with id {conv_id}")


def load(conn: sqlite3.Connection, row: sqlite3.Row) -> Conversation:
    """The conversation with its shown path; each message learns its versions from the ids and
    parents of the whole tree (small: no text is read for branches not shown)."""
    if row["leaf_id"] is None:
        return conversation_from_row(row, [])
    path = conn.execute(_PATH_SQL, (row["leaf_id"],)).fetchall()
    versions: dict[int | None, list[int]] = {}
    for message_id, parent_id in conn.execute(
        "SELECT id, parent_id FROM messages WHERE conversation_id = ? ORDER BY id", (row["id"],)
    ):
        versions.setdefault(parent_id, []).append(message_id)
    return conversation_from_row(row, [message_from_row(r, versions[r["parent_id"]]) for r in path])


def path_ids(conn: sqlite3.Connection, leaf_id: int | None) -> list[int]:
    """The ids from the root down to ``leaf_id`` (None: an empty chat)."""
    return [] if leaf_id is None else [r["id"] for r in conn.execute(_PATH_SQL, (leaf_id,))]


def sibling_ids(conn: sqlite3.Connection, conv_id: int, parent_id: int | None) -> list[int]:
    """The versions below ``parent_id`` (None: the first messages), oldest first."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
            (conv_id, parent_id),
        )
    ]


def descendants(conn: sqlite3.Connection, conv_id: int, message_id: int | None) -> list[int]:
    """Every message below ``message_id`` (None: every message of the conversation)."""
    return [
        r[0]
        for r in conn.execute(
            "WITH RECURSIVE below(id) AS ("
            "    SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ?"
            "    UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id) "
            "SELECT id FROM below",
            (conv_id, message_id),
        )
    ]


def newest_leaf(conn: sqlite3.Connection, message_id: int) -> int:
    """The most recently created message without children at or below ``message_id``: where the
    branch through it was last written to."""
    return conn.execute(
        "WITH RECURSIVE below(id) AS ("
        "    SELECT ? UNION ALL SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id) "
        "SELECT MAX(id) FROM below "
        "WHERE NOT EXISTS (SELECT 1 FROM messages c WHERE c.parent_id = below.id)",
        (message_id,),
    ).fetchone()[0]


def set_leaf(conn: sqlite3.Connection, conv_id: int, leaf_id: int | None) -> None:
    """Show the path to ``leaf_id`` (None: an empty chat)."""
    conn.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf_id, conv_id))


def add(
    conn: sqlite3.Connection,
    conv_id: int,
    parent_id: int | None,
    role: str,
    content: str,
    stats: str | None,
    model: str | None = None,
) -> Message:
    """Insert a child of ``parent_id`` and select it; the message as stored, with its versions.
    ``stats``: as stored (records.stats_json)."""
    now = time.time()
    touch(conn, conv_id, now)
    parent = conn.execute("SELECT position FROM messages WHERE id = ?", (parent_id,)).fetchone()
    cur = conn.execute(
        "INSERT INTO messages (conversation_id, parent_id, position, role, content, created_at, stats, model) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (conv_id, parent_id, parent[0] + 1 if parent else 0, role, content, now, stats, model),
    )
    set_leaf(conn, conv_id, cur.lastrowid)
    row = conn.execute("SELECT * FROM messages WHERE id = ?", (cur.lastrowid,)).fetchone()
    return message_from_row(row, sibling_ids(conn, conv_id, parent_id))


def mark_unanswered(conn: sqlite3.Connection, leaf_id: int | None) -> None:
    """Mark the questions at the end of the path to ``leaf_id``, after its last reply, as left
    unanswered (their other stats kept)."""
    for row in (
        conn.execute(_TRAILING_QUESTIONS_SQL, (leaf_id,)).fetchall() if leaf_id is not None else []
    ):
        stats = stats_dict(row["stats"]) or {}
        if not stats.get("unanswered"):
            conn.execute(
                "UPDATE messages SET stats = ? WHERE id = ?",
                (stats_json({**stats, "unanswered": True}), row["id"]),
            )


def delete_messages(conn: sqlite3.Connection, ids: list[int]) -> None:
    """Delete these messages (whole subtrees). Each is detached from its parent first: deleting
    a root would otherwise cascade one trigger level per generation, and SQLite stops at 1000."""
    rows = [(i,) for i in ids]
    conn.executemany("UPDATE messages SET parent_id = NULL WHERE id = ?", rows)
    conn.executemany("DELETE FROM messages WHERE id = ?", rows)
