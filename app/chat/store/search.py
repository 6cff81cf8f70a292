"""Full-text search over titles and messages, on the FTS5 indexes the schema keeps in sync."""

from __future__ import annotations

import sqlite3

from .base import StoreBase
from .records import ConversationSummary
from .rows import SUMMARY_COLUMNS, summary_from_row

SNIPPET_TOKENS = 12  # words of context in a search result's snippet


class SearchMixin(StoreBase):
    """ConversationStore.search."""

    def search(self, query: str, limit: int = 50) -> list[ConversationSummary]:
        """Conversations whose title, or one of whose messages (in any branch), has every word of
        ``query``, the last word as a prefix (results while typing); most recently updated first.
        Any text is safe to pass: each word is quoted, so FTS5 syntax in it means nothing."""
        match = fts_query(query)
        if match is None or limit < 1:
            return []
        with self._read() as conn:
            rows = conn.execute(
                "WITH hits AS (SELECT m.conversation_id, MAX(m.id) AS newest FROM messages_fts "
                "              JOIN messages m ON m.id = messages_fts.rowid "
                "              WHERE messages_fts MATCH :match GROUP BY m.conversation_id) "
                f"SELECT {SUMMARY_COLUMNS}, hits.newest FROM conversations c "
                "LEFT JOIN hits ON hits.conversation_id = c.id "
                "WHERE hits.newest IS NOT NULL "
                "   OR c.id IN (SELECT rowid FROM conversations_fts WHERE conversations_fts MATCH :match) "
                "ORDER BY c.updated_at DESC, c.id DESC LIMIT :limit",
                {"match": match, "limit": int(limit)},
            ).fetchall()
            return [summary_from_row(r, _snippet(conn, match, r["newest"])) for r in rows]


def fts_query(text: str) -> str | None:
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
    row = conn.execute(
        "SELECT snippet(messages_fts, 0, '', '', '…', ?) FROM messages_fts "
        "WHERE messages_fts MATCH ? AND rowid = ?",
        (SNIPPET_TOKENS, match, message_id),
    ).fetchone()
    return row[0] if row else ""
