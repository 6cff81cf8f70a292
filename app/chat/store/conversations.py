"""Whole conversations: create, read, retitle, change settings, delete, list."""

from __future__ import annotations

import json
import time

from . import tree
from .base import StoreBase
from .records import (
    DEFAULT_TITLE,
    ChatSettings,
    Conversation,
    ConversationSummary,
    NotFoundError,
    check_message,
    default_settings,
)
from .rows import SUMMARY_COLUMNS, conversation_from_row, conversation_row, summary_from_row


class ConversationsMixin(StoreBase):
    """The conversation-level methods of ConversationStore."""

    @staticmethod
    def default_settings() -> ChatSettings:
        """The settings a new conversation starts with (same as records.default_settings)."""
        return default_settings()

    def create(
        self,
        title: str = DEFAULT_TITLE,
        settings: ChatSettings | None = None,
        first_message: str | None = None,
    ) -> Conversation:
        """A new conversation; it becomes the most recently updated. ``first_message``: the user's
        message it starts with, stored in the same transaction (a failed store of it leaves no
        empty chat behind); None: the conversation starts empty."""
        title = _clean_title(title)
        settings = settings if settings is not None else default_settings()
        settings.validate()
        if first_message is not None:
            check_message("user", first_message)
        now = time.time()
        with self._write() as conn:
            cur = conn.execute(
                f"INSERT INTO conversations (title, created_at, updated_at, settings) "
                f"VALUES (?, ?, {tree.NEWEST}, ?)",
                (title, now, now, json.dumps(settings.to_dict())),
            )
            if first_message is not None:
                tree.add(conn, cur.lastrowid, None, "user", first_message, None)
            return tree.load(conn, conversation_row(conn, cur.lastrowid))

    def get(self, conv_id: int) -> Conversation:
        """The conversation with the shown path (root to selected leaf) as ``messages``, each with
        its place among its versions; NotFoundError if there is none."""
        with self._read() as conn:
            return tree.load(conn, conversation_row(conn, conv_id))

    def revision(self, conv_id: int) -> int:
        """How many writes the conversation has had (any change to it raises it); NotFoundError
        if there is none. One indexed read: a page asks it every second."""
        with self._read() as conn:
            return conversation_row(conn, conv_id)["revision"]

    def heading(self, conv_id: int) -> Conversation:
        """The conversation without its messages (``messages`` is empty): its title, settings and
        revision in one indexed read, which a page makes every second; NotFoundError if there is none."""
        with self._read() as conn:
            return conversation_from_row(conversation_row(conn, conv_id), [])

    def rename(self, conv_id: int, title: str) -> None:
        """Retitle the conversation. Its place in the list and its time stay: they say when the
        chat was last written to, and a chat that jumped to the top when renamed would leave the
        user's pointer over another one (as in peer apps, renaming is not using)."""
        title = _clean_title(title)
        with self._write() as conn:
            conversation_row(conn, conv_id)
            conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))

    def update_settings(self, conv_id: int, settings: ChatSettings) -> None:
        """Replace the conversation's settings; ValueError (nothing stored) if they are invalid.
        Like :meth:`rename`, it leaves the chat's place in the list and its time alone."""
        settings.validate()
        with self._write() as conn:
            conversation_row(conn, conv_id)
            conn.execute(
                "UPDATE conversations SET settings = ? WHERE id = ?",
                (json.dumps(settings.to_dict()), conv_id),
            )

    def delete(self, conv_id: int) -> None:
        """Delete the conversation and (by cascade) all its messages."""
        with self._write() as conn:
            # detached first, so the cascade is one level deep (see tree.delete_messages)
            conn.execute(
                "UPDATE messages SET parent_id = NULL WHERE conversation_id = ?", (conv_id,)
            )
            if conn.execute("DELETE FROM conversations WHERE id = ?", (conv_id,)).rowcount == 0:
                raise NotFoundError(f"no conversation with id {conv_id}")

    # Defined last: inside the class body the name `list` is this method from here on.
    def list(self) -> list[ConversationSummary]:
        """Every conversation, most recently updated first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {SUMMARY_COLUMNS} FROM conversations c "
                "ORDER BY c.updated_at DESC, c.id DESC"
            ).fetchall()
        return [summary_from_row(r) for r in rows]


def _clean_title(title: str) -> str:
    """The title on one line, its runs of spaces made one; ValueError if nothing is left."""
    title = " ".join(str(title).split())
    if not title:
        raise ValueError("a conversation title cannot be empty")
    return title
