"""Rows of the two tables found by id and read as records."""

from __future__ import annotations

import json
import sqlite3

from .records import (
    ChatSettings,
    Conversation,
    ConversationSummary,
    Message,
    MessageStats,
    NotFoundError,
    tool_calls_from_json,
)

# The columns of a summary row; ``n``, the shown path's length, is the leaf's depth + 1.
SUMMARY_COLUMNS = (
    "c.id, c.title, c.created_at, c.updated_at, "
    "COALESCE((SELECT position + 1 FROM messages WHERE id = c.leaf_id), 0) AS n"
)


def conversation_row(conn: sqlite3.Connection, conv_id: int) -> sqlite3.Row:
    """The conversation's row; NotFoundError if there is none (in a write, that rolls it back)."""
    row = conn.execute("SELECT * FROM conversations WHERE id = ?", (conv_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no conversation with id {conv_id}")
    return row


def message_row(conn: sqlite3.Connection, conv_id: int, message_id: int) -> sqlite3.Row:
    """The message, which must belong to the conversation; NotFoundError otherwise."""
    conversation_row(conn, conv_id)
    row = conn.execute(
        "SELECT * FROM messages WHERE id = ? AND conversation_id = ?", (message_id, conv_id)
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no message with id {message_id} in conversation {conv_id}")
    return row


def message_from_row(row: sqlite3.Row, siblings: list[int] | None = None) -> Message:
    """A message from its row; ``siblings``: the ids of its versions, oldest first."""
    stats = MessageStats.from_dict(json.loads(row["stats"])) if row["stats"] is not None else None
    siblings = siblings or [row["id"]]
    return Message(
        row["id"],
        row["conversation_id"],
        row["position"],
        row["role"],
        row["content"],
        row["created_at"],
        stats,
        row["parent_id"],
        siblings.index(row["id"]),
        len(siblings),
        row["model"],
        tool_calls_from_json(row["tool_calls"]),
    )


def conversation_from_row(row: sqlite3.Row, messages: list[Message]) -> Conversation:
    settings = ChatSettings.from_dict(json.loads(row["settings"]))
    return Conversation(
        row["id"],
        row["title"],
        row["created_at"],
        row["updated_at"],
        settings,
        messages,
        row["revision"],
    )


def summary_from_row(row: sqlite3.Row, snippet: str = "") -> ConversationSummary:
    """A sidebar row from a row of SUMMARY_COLUMNS."""
    return ConversationSummary(
        row["id"], row["title"], row["created_at"], row["updated_at"], row["n"], snippet
    )
