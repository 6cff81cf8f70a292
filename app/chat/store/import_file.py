"""Reading and checking a file to import, before anything is stored.

Two kinds of file: our own export (``export_json``; its whole tree when it has one) and
OpenAI-style messages, ``{"messages": [...]}`` or a bare list, where a leading system message
becomes the system prompt. :func:`plan_import` checks the file whole and returns an
:class:`ImportPlan`; BadImportFile says where and what is wrong, in words the user can act on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .records import (
    ROLES,
    ChatSettings,
    MessageStats,
    ToolCallRecord,
    default_settings,
    is_number,
    is_whole,
    shown_value,
    title_from,
    tool_calls_json,
)

EXPORT_FORMAT = "minisgl-chat conversation"
IMPORT_LIMIT_BYTES = 20_000_000  # "20 MB" in what the user is told
IMPORT_TITLE_LIMIT = 200  # characters; the UI's rename box allows as many


class BadImportFile(ValueError):
    """A file given to :meth:`ConversationStore.import_conversation` cannot be imported; the
    message says where and what is wrong, so the user can fix the file (not named ImportError,
    which is Python's own)."""


@dataclass(frozen=True)
class ImportedMessage:
    """A message read from an import file, before it has an id here."""

    role: str
    content: str
    created_at: float | None
    stats: str | None  # as stored: MessageStats as JSON
    key: int = 0  # its id in the file's tree, or its index in a list
    parent: int | None = None  # its parent's key
    model: str | None = None  # the model that wrote a reply (our export's "model")
    tool_calls: str | None = None  # as stored: a reply's ToolCallRecords as JSON


@dataclass(frozen=True)
class ImportPlan:
    """A whole import file, checked: what import_conversation stores in one transaction."""

    title: str
    settings: ChatSettings
    created_at: float | None
    messages: list[ImportedMessage]  # parents before children
    leaf: int  # key of the message to show the path to
    updated_at: float | None = None  # when the chat was last used, as our export says

    @property
    def used_at(self) -> float | None:
        """When the chat was last used, as the file says: its updated_at, else its newest
        message's date; None when it says neither (an OpenAI-style list)."""
        if self.updated_at is not None:
            return self.updated_at
        return max((m.created_at for m in self.messages if m.created_at is not None), default=None)


def plan_import(text: str | bytes) -> ImportPlan:
    """Read and check an import file; BadImportFile names the first problem."""
    doc = _parse_json(_decoded(text))
    if isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT:
        return _plan_ours(doc)
    if isinstance(doc, dict) and "messages" in doc:
        return _plan_openai(doc["messages"], doc.get("title"))
    if isinstance(doc, list):
        return _plan_openai(doc, None)
    raise BadImportFile(
        'expected a minisgl-chat export, an object with a "messages" list, '
        f"or a list of messages; got {_kind(doc)}"
    )


def _decoded(text: str | bytes) -> str:
    """The file's text, within IMPORT_LIMIT_BYTES, without a byte order mark."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > IMPORT_LIMIT_BYTES:
            raise _too_big(len(text))
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadImportFile(
                f"not UTF-8 text: byte {e.start + 1} (0x{text[e.start]:02x}) cannot be "
                "read; save the file as UTF-8"
            ) from None
    elif not isinstance(text, str):
        raise TypeError(f"import_conversation takes text or bytes (got {type(text).__name__})")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > IMPORT_LIMIT_BYTES:
        raise _too_big(size)
    return text.removeprefix("\ufeff")


def _parse_json(text: str) -> object:
    if not text.strip():
        raise BadImportFile(
            "the file is empty"
        )  # says more than json's "Expecting value at line 1 column 1"
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadImportFile(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise BadImportFile("not JSON that can be read: it is nested too deeply") from None


def _too_big(size: int) -> BadImportFile:
    return BadImportFile(
        f"the file is {size / 1e6:.1f} MB; the limit is {IMPORT_LIMIT_BYTES / 1e6:.0f} MB"
    )


def _plan_ours(doc: dict[str, Any]) -> ImportPlan:
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
    created_at, updated_at = doc.get("created_at"), doc.get("updated_at")
    return ImportPlan(
        _import_title(doc.get("title"), messages),
        settings,
        float(created_at) if is_number(created_at) else None,
        messages,
        leaf,
        float(updated_at) if is_number(updated_at) else None,
    )


def _plan_openai(items: object, title: object) -> ImportPlan:
    """OpenAI-style messages; a leading system message becomes the system prompt."""
    parsed = _read_messages(items, "messages")
    system_prompt = parsed.pop(0).content if parsed and parsed[0].role == "system" else ""
    settings = _checked_settings(
        replace(default_settings(), system_prompt=system_prompt), "messages[0]"
    )
    messages = _chain(parsed)
    return ImportPlan(_import_title(title, messages), settings, None, messages, len(messages) - 1)


def _read_messages(items: object, where: str) -> list[ImportedMessage]:
    if not isinstance(items, list):
        raise BadImportFile(f"{where}: expected a list of messages, got {_kind(items)}")
    if not items:
        raise BadImportFile("no messages to import")
    return [_read_message(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _chain(messages: list[ImportedMessage]) -> list[ImportedMessage]:
    """A list of messages as one branch: each the child of the one before."""
    if not messages:
        raise BadImportFile("no messages to import")
    return [replace(m, key=i, parent=i - 1 if i else None) for i, m in enumerate(messages)]


def _read_tree(tree: object, leaf_id: object) -> tuple[list[ImportedMessage], int]:
    """Our export's ``tree``: every parent must come before its children (as we write it)."""
    if not isinstance(tree, list):
        raise BadImportFile(f"tree: expected a list of messages, got {_kind(tree)}")
    out: list[ImportedMessage] = []
    seen: set[int] = set()
    for i, item in enumerate(tree):
        where = f"tree[{i}]"
        message = _read_message(item, where)
        key, parent = item.get("id"), item.get("parent_id")
        if not is_whole(key):
            raise BadImportFile(f"{where}.id: expected a whole number, got {shown_value(key)}")
        if key in seen:
            raise BadImportFile(f"{where}.id: {key} is also the id of an earlier message")
        if parent is not None and (not is_whole(parent) or parent not in seen):
            raise BadImportFile(
                f"{where}.parent_id: {shown_value(parent)} is not the id of an earlier message"
            )
        seen.add(key)
        out.append(replace(message, key=key, parent=parent))
    if not out:
        raise BadImportFile("no messages to import")
    if leaf_id is None:
        return out, out[-1].key  # listed after its parents, so it has no children
    if not is_whole(leaf_id) or leaf_id not in seen:
        raise BadImportFile(
            f"leaf_id: {shown_value(leaf_id)} is not the id of a message in the tree"
        )
    return out, leaf_id


def _read_message(item: object, where: str) -> ImportedMessage:
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
    return ImportedMessage(
        role,
        _content_text(item["content"], f"{where}.content"),
        float(created_at) if is_number(created_at) else None,
        _read_stats(item.get("stats"), f"{where}.stats"),
        model=model,
        tool_calls=_read_tool_calls(item.get("tool_calls"), f"{where}.tool_calls"),
    )


def _read_tool_calls(value: object, where: str) -> str | None:
    """A reply's tool calls (our export's ``tool_calls``), checked, as stored."""
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise BadImportFile(f"{where}: expected a list of tool calls, got {_kind(value)}")
    try:
        calls = tuple(ToolCallRecord.from_dict(c) for c in value if isinstance(c, dict))
    except (TypeError, ValueError) as exc:
        raise BadImportFile(f"{where}: {exc}") from None
    if len(calls) != len(value):
        raise BadImportFile(f"{where}: each tool call is an object")
    return tool_calls_json(calls)


def _content_text(content: object, where: str) -> str:
    """Text, or OpenAI's list of parts of which only text ones can be imported (joined by lines)."""
    if isinstance(content, str):
        return _checked_text(content, where)
    if not isinstance(content, list):
        raise BadImportFile(f"{where}: expected text or a list of text parts, got {_kind(content)}")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise BadImportFile(
                f'{where}[{i}]: expected a part like {{"type": "text", "text": "..."}}, '
                f"got {_kind(part)}"
            )
        if part.get("type") != "text":
            raise BadImportFile(
                f"{where}[{i}].type: only text parts can be imported, "
                f"not {shown_value(part.get('type'))}"
            )
        if not isinstance(part.get("text"), str):
            raise BadImportFile(f"{where}[{i}].text: expected text, got {_kind(part.get('text'))}")
        texts.append(part["text"])
    return _checked_text("\n".join(texts), where)


def _checked_text(text: str, where: str) -> str:
    """Text SQLite can store as UTF-8: JSON may carry half a surrogate pair ("\\ud83d", a cut emoji)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadImportFile(
            f"{where}: character {e.start + 1} is {ascii(text[e.start])}, half of a "
            "character pair (a cut emoji?); remove it"
        ) from None
    return text


# What each stats field may hold in an import file (null is always allowed).
_STATS_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ttft_ms": (is_number, "a number"),
    "tok_s": (is_number, "a number"),
    "tokens": (lambda v: is_whole(v) and v >= 0, "a whole number"),
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
    return json.dumps(
        replace(stats, stopped=bool(stats.stopped), unanswered=bool(stats.unanswered)).to_dict()
    )


def _checked_settings(settings: ChatSettings, where: str) -> ChatSettings:
    try:
        settings.validate()
    except ValueError as e:
        raise BadImportFile(f"{where}: {e}") from None
    return settings


def _import_title(title: object, messages: list[ImportedMessage]) -> str:
    """The file's title, else one from the first user message; at most IMPORT_TITLE_LIMIT chars."""
    if title is not None and not isinstance(title, str):
        raise BadImportFile(f"title: expected text, got {_kind(title)}")
    text = " ".join(_checked_text(title or "", "title").split())
    if not text:
        text = title_from(next((m.content for m in messages if m.role == "user"), ""))
    return text if len(text) <= IMPORT_TITLE_LIMIT else text[: IMPORT_TITLE_LIMIT - 1] + "…"


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
