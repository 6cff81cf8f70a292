"""Messages in a conversation's tree: add one, grow a streamed reply, move between versions,
cut and delete branches."""

from __future__ import annotations

import time

from . import tree
from .base import StoreBase
from .records import (
    Conversation,
    Message,
    NotFoundError,
    StatsLike,
    ToolCallRecord,
    check_message,
    stats_json,
    tool_calls_json,
)
from .rows import conversation_row, message_row


class MessagesMixin(StoreBase):
    """The message-level methods of ConversationStore."""

    def append(
        self,
        conv_id: int,
        role: str,
        content: str,
        stats: StatsLike | None = None,
        model: str | None = None,
        leave_unanswered: bool = False,
    ) -> Message:
        """Add a message below the selected leaf and select it: the next turn of the shown chat.
        ``leave_unanswered``: the questions at the shown path's end (after its last reply) are
        marked as left unanswered first, in the same transaction, so a failed append leaves no
        marks."""
        check_message(role, content)
        stored_stats = stats_json(stats)
        with self._write() as conn:
            leaf = conversation_row(conn, conv_id)["leaf_id"]
            if leave_unanswered:
                tree.mark_unanswered(conn, leaf)
            return tree.add(conn, conv_id, leaf, role, content, stored_stats, model)

    def add_message(
        self,
        conv_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        stats: StatsLike | None = None,
        model: str | None = None,
    ) -> Message:
        """Add a child of ``parent_id`` (None: a new first message) and select it. Regenerate and
        edit pass the old message's parent: the new version is its sibling, the old one stays.
        ``model``: the model that writes a reply."""
        check_message(role, content)
        stored_stats = stats_json(stats)
        with self._write() as conn:
            conversation_row(conn, conv_id)
            if parent_id is not None:
                message_row(conn, conv_id, parent_id)
            return tree.add(conn, conv_id, parent_id, role, content, stored_stats, model)

    def update_message(
        self,
        message_id: int,
        content: str,
        stats: StatsLike | None = None,
        model: str | None = None,
        tool_calls: tuple[ToolCallRecord, ...] | None = None,
    ) -> None:
        """Replace a message's content, whatever its role (a streamed reply as it grows);
        ``stats=None`` keeps the stored stats, so only the final update needs to carry them
        (``model=None`` and ``tool_calls=None`` likewise keep the stored ones).

        The conversation's updated_at is left alone: the turn was dated when its reply was added,
        and a stream that re-dated its chat every half second would make two replying chats swap
        places in the sidebar under the user's pointer."""
        check_message("assistant", content)
        with self._write() as conn:
            row = conn.execute(
                "SELECT conversation_id FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            if row is None:
                raise NotFoundError(f"no message with id {message_id}")
            conn.execute(
                "UPDATE messages SET content = ?, stats = COALESCE(?, stats), "
                "model = COALESCE(?, model), tool_calls = COALESCE(?, tool_calls) WHERE id = ?",
                (content, stats_json(stats), model, tool_calls_json(tool_calls), message_id),
            )

    def truncate_after(self, conv_id: int, position: int) -> None:
        """Drop everything below the shown path's message at ``position`` (every version, not
        only the shown one) and select that message; -1 drops every message. What a linear chat
        meant by "drop the messages after position"; branches that part above it are kept."""
        with self._write() as conn:
            tree.touch(conn, conv_id, time.time())
            path = tree.path_ids(conn, conversation_row(conn, conv_id)["leaf_id"])
            if position >= len(path):
                return
            keep = path[position] if position >= 0 else None
            tree.delete_messages(conn, tree.descendants(conn, conv_id, keep))
            tree.set_leaf(conn, conv_id, keep)

    def select_message(self, conv_id: int, message_id: int) -> Conversation:
        """Show the path through ``message_id``; below it, the branch written to last (the path
        ends at the newest leaf under it). Navigation: the sidebar order does not change."""
        with self._write() as conn:
            message_row(conn, conv_id, message_id)
            tree.set_leaf(conn, conv_id, tree.newest_leaf(conn, message_id))
            return tree.load(conn, conversation_row(conn, conv_id))

    def switch_version(self, conv_id: int, message_id: int, step: int) -> Conversation:
        """Show the previous (``step`` -1) or next (+1) version of a message, i.e. its sibling,
        clamped to the first and last; below it as in :meth:`select_message`."""
        with self._write() as conn:
            row = message_row(conn, conv_id, message_id)
            siblings = tree.sibling_ids(conn, conv_id, row["parent_id"])
            i = min(max(siblings.index(message_id) + int(step), 0), len(siblings) - 1)
            tree.set_leaf(conn, conv_id, tree.newest_leaf(conn, siblings[i]))
            return tree.load(conn, conversation_row(conn, conv_id))

    def delete_message(self, conv_id: int, message_id: int) -> Conversation:
        """Delete a message and everything below it. If the shown path ran through it, it now runs
        through another version of it (the previous one, else the next), else ends at its parent."""
        with self._write() as conn:
            tree.touch(conn, conv_id, time.time())
            row = message_row(conn, conv_id, message_id)
            leaf = conversation_row(conn, conv_id)["leaf_id"]
            siblings = tree.sibling_ids(conn, conv_id, row["parent_id"])
            doomed = [message_id, *tree.descendants(conn, conv_id, message_id)]
            tree.delete_messages(conn, doomed)
            if leaf in set(doomed):
                i = siblings.index(message_id)
                others = siblings[:i][-1:] + siblings[i + 1 : i + 2]  # the previous, else the next
                tree.set_leaf(
                    conn, conv_id, tree.newest_leaf(conn, others[0]) if others else row["parent_id"]
                )
            return tree.load(conn, conversation_row(conn, conv_id))
