"""What a message is made of before it is stored: the text typed (or edited) and the files
attached to it; and the versions bar's note after an edit. No Gradio here."""

from __future__ import annotations

from typing import Any

from .store import plural
from .view import typed_text


def edit_text(value: Any) -> str:
    """The text of an edited message as Gradio sends it (a string, or a list of text parts), as
    the user typed it (without the marks that show its HTML as text: view.shown_literally)."""
    if isinstance(value, list):
        return "".join(edit_text(v) for v in value)
    if isinstance(value, dict):
        return typed_text(str(value.get("text") or value.get("content") or ""))
    return typed_text("" if value is None else str(value)).strip()


def with_attachments(text: str, attachments: list[tuple[str, str]]) -> str:
    """The message with each attached file after it, under its name, in a fenced block."""
    parts = [text] if text else []
    for name, body in attachments:
        fence = "````" if "```" in body else "```"
        parts.append(f"**{name}**\n{fence}\n{body.rstrip()}\n{fence}")
    return "\n\n".join(parts)


def attachments_line(attachments: list[tuple[str, str]]) -> str:
    if not attachments:
        return ""
    files = (
        f"`{name}` ({len(body):,} {plural('character', len(body))})" for name, body in attachments
    )
    return "Attached to your next message: " + ", ".join(files)


def branch_note(later: int) -> str:
    """What the versions bar says after an edit of a message with ``later`` messages after it
    (the bar acts on the new version): the chat now shows the new version alone, and the old one
    with its continuation is still there."""
    after = "the message after it" if later == 1 else f"the {later} messages after it"
    return f"new branch: the earlier version and {after} are kept (‹ shows them)"
