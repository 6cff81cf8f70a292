"""A conversation in and out of files: import (checked by import_file), JSON and Markdown export."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from datetime import datetime
from typing import Any

from . import tree
from .base import StoreBase
from .import_file import EXPORT_FORMAT, IMPORT_TITLE_LIMIT, ImportPlan, plan_import
from .records import Conversation, ToolCallRecord, stats_dict, tool_calls_from_json
from .rows import conversation_row
from .schema import SCHEMA_VERSION

IMPORTED_SUFFIX = " (imported)"


class ImportExportMixin(StoreBase):
    """The import and export methods of ConversationStore."""

    def import_conversation(self, text: str | bytes) -> Conversation:
        """A new conversation from a file's text: our own export_json (its whole tree when it has
        one) or OpenAI-style messages, ``{"messages": [...]}`` or a bare list, where a leading
        system message becomes the system prompt. The file is checked whole before anything is
        stored; BadImportFile says what is wrong, and then nothing is. A title a chat already has
        gets " (imported)" (re-importing an export), so the sidebar tells the two apart. The chat
        keeps the date it was last used as the file says (``ImportPlan.used_at``, never later than
        now), and so its place in the list; a file that says none dates it now."""
        plan = plan_import(text)
        now = time.time()
        used = plan.used_at
        with self._write() as conn:
            if conn.execute(
                "SELECT 1 FROM conversations WHERE title = ?", (plan.title,)
            ).fetchone():
                plan = replace(
                    plan,
                    title=plan.title[: IMPORT_TITLE_LIMIT - len(IMPORTED_SUFFIX)] + IMPORTED_SUFFIX,
                )
            updated_at = tree.NEWEST if used is None else "?"
            cur = conn.execute(
                f"INSERT INTO conversations (title, created_at, updated_at, settings) "
                f"VALUES (?, ?, {updated_at}, ?)",
                (
                    plan.title,
                    plan.created_at or now,
                    now if used is None else min(used, now),
                    json.dumps(plan.settings.to_dict()),
                ),
            )
            leaf = _insert_messages(conn, cur.lastrowid, plan, now)
            tree.set_leaf(conn, cur.lastrowid, tree.newest_leaf(conn, leaf))
            return tree.load(conn, conversation_row(conn, cur.lastrowid))

    def export_markdown(self, conv_id: int) -> str:
        """The shown path as a Markdown document: title, system prompt, then each turn."""
        with self._read() as conn:
            conv = tree.load(conn, conversation_row(conn, conv_id))
        out = [
            f"# {conv.title}",
            "",
            f"_Exported from minisgl-chat, {_when(time.time())}. "
            f"Started {_when(conv.created_at)}._",
            "",
        ]
        if conv.settings.system_prompt:
            out += ["**System prompt:**", "", _quote(conv.settings.system_prompt), ""]
        for m in conv.messages:
            out += [f"## {m.role.capitalize()}", "", *_text_and_calls(m.content, m.tool_calls)]
            line = " · ".join(
                x
                for x in (
                    m.model if m.role == "assistant" else None,
                    m.stats.summary() if m.stats is not None else None,
                )
                if x
            )
            if line:
                out += [f"_{line}_", ""]
        return "\n".join(out).rstrip() + "\n"

    def export_json(self, conv_id: int) -> str:
        """The conversation as JSON: title, settings, the shown path as ``messages`` (with stats),
        every version as ``tree`` (parents before children) with the selected ``leaf_id``, and the
        schema version. :meth:`import_conversation` reads it back, branches included."""
        with self._read() as conn:
            row = conversation_row(conn, conv_id)
            conv = tree.load(conn, row)
            rows = conn.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position, id", (conv_id,)
            ).fetchall()
        doc: dict[str, Any] = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "id": conv.id,
            "title": conv.title,
            "created_at": conv.created_at,
            "updated_at": conv.updated_at,
            "settings": conv.settings.to_dict(),
            "messages": [
                {
                    "id": m.id,
                    "position": m.position,
                    "role": m.role,
                    "content": m.content,
                    "created_at": m.created_at,
                    "stats": m.stats.to_dict() if m.stats else None,
                    "model": m.model,
                    "tool_calls": [c.to_dict() for c in m.tool_calls],
                }
                for m in conv.messages
            ],
            "leaf_id": row["leaf_id"],
            "tree": [
                {
                    "id": r["id"],
                    "parent_id": r["parent_id"],
                    "role": r["role"],
                    "content": r["content"],
                    "created_at": r["created_at"],
                    "stats": stats_dict(r["stats"]),
                    "model": r["model"],
                    "tool_calls": [c.to_dict() for c in tool_calls_from_json(r["tool_calls"])],
                }
                for r in rows
            ],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)


def _insert_messages(conn: sqlite3.Connection, conv_id: int, plan: ImportPlan, now: float) -> int:
    """Store the plan's messages in one batch and return the id its leaf got. The ids are chosen
    here, after every id used so far, as AUTOINCREMENT would give them (parents first, so each
    parent's id is known): row by row, a chat of 100,000 messages takes some 20 seconds."""
    (last,) = conn.execute(
        "SELECT MAX(COALESCE((SELECT MAX(id) FROM messages), 0), COALESCE("
        "(SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0))"
    ).fetchone()
    new_ids: dict[int, tuple[int, int]] = {}  # key in the file -> (id, position) here
    rows = []
    for new_id, m in enumerate(plan.messages, start=last + 1):
        parent_id, parent_position = new_ids[m.parent] if m.parent is not None else (None, -1)
        new_ids[m.key] = (new_id, parent_position + 1)
        rows.append(
            (
                new_id,
                conv_id,
                parent_id,
                parent_position + 1,
                m.role,
                m.content,
                m.created_at or now,
                m.stats,
                m.model,
                m.tool_calls,
            )
        )
    conn.executemany(
        "INSERT INTO messages (id, conversation_id, parent_id, position, role, content, created_at, "
        "stats, model, tool_calls) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return new_ids[plan.leaf][0]


def _text_and_calls(content: str, calls: tuple[ToolCallRecord, ...]) -> list[str]:
    """A message's lines: its text, with each of its tool calls where the model made it (the
    call's offset in the text), as the page shows them."""
    out: list[str] = []
    start = 0
    for offset in sorted({min(c.offset, len(content)) for c in calls}):
        if piece := content[start:offset].strip():
            out += [_with_line_breaks(piece), ""]
        here = [c for c in calls if min(c.offset, len(content)) == offset]
        out += [line for call in here for line in _tool_call_markdown(call)]
        start = offset
    rest = content[start:].strip() if calls else content
    return out + [_with_line_breaks(rest), ""] if rest or not calls else out


def _tool_call_markdown(call: ToolCallRecord) -> list[str]:
    """A tool call in its reply: the tool, its arguments and its result, as code blocks."""
    return [
        f"**Tool call** `{call.tool}` ({call.state}):",
        "",
        "```json",
        call.arguments,
        "```",
        "",
        "```text",
        call.result.replace("```", "ˋˋˋ"),
        "```",
        "",
    ]


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _with_line_breaks(text: str) -> str:
    """``text`` with each line that another follows ending in a Markdown hard break (two spaces),
    as the page shows it: a viewer would run the lines into one paragraph. Code blocks (and their
    fences) are left as they are."""
    lines, in_code = text.split("\n"), False
    for i, line in enumerate(lines[:-1]):
        fence = line.lstrip().startswith(("```", "~~~"))
        if fence:
            in_code = not in_code
        elif not in_code and line.strip() and lines[i + 1].strip() and not line.endswith("  "):
            lines[i] = line + "  "
    return "\n".join(lines)


def _quote(text: str) -> str:
    """``text`` as a Markdown block quote, blank lines included."""
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())
