"""Tool calls in a chat reply: the model writes them in its chat template's convention, the
endpoint returns them as OpenAI's ``tool_calls`` (``finish_reason: "tool_calls"``).

Two conventions, told apart by the chat template:

- ``hermes`` (Qwen2.5, Qwen3 and many others): each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; text around the calls is content.
- ``llama3`` (Llama 3.1 and later): the whole reply is one JSON object
  ``{"name": ..., "parameters": {...}}``.

Parsing works on streamed text: a call goes out whole, as one ``tool_calls`` delta, once its end
is seen (a client joins deltas, so one delta with all the arguments is valid OpenAI streaming).
A block that is not valid JSON is left in the content, never dropped.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from .reasoning import partial_tag_at_end

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


def template_tool_format(chat_template: object) -> str | None:
    """The tool-call convention a chat template teaches its model, None if it has no tools."""
    text = chat_template if isinstance(chat_template, str) else str(chat_template or "")
    if CALL_START in text:
        return "hermes"
    if "<|python_tag|>" in text or ("tools" in text and '"parameters"' in text):
        return "llama3"
    return None


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def parse_call(text: str, arguments_key: str = "arguments") -> ToolCall | None:
    """One call from its JSON text, None if it is not a call."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(
        obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    )


class ToolCallParser:
    """Feeds on a reply's answer text as it streams; hands out (content, finished calls)."""

    def __init__(self, tool_format: str) -> None:
        self.format = tool_format
        self.state = (
            "opening"  # opening -> text | call | after (whitespace after a call) | json (llama3)
        )
        self.pending = ""

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self.pending += text
        content, calls = "", []
        while True:
            if self.state == "opening":
                head = self.pending.lstrip()
                if not head:
                    return content, calls
                self.state = "json" if self.format == "llama3" and head.startswith("{") else "text"
                if self.state == "json":
                    return content, calls  # the whole reply is the call: wait for its end
                continue
            if self.state == "json":
                return content, calls
            if self.state == "after":
                self.pending = self.pending.lstrip()
                if not self.pending:
                    return content, calls
                self.state = "text"
            if self.state == "text":
                start = self.pending.find(CALL_START) if self.format == "hermes" else -1
                if start < 0:
                    keep = (
                        partial_tag_at_end(self.pending, CALL_START)
                        if self.format == "hermes"
                        else 0
                    )
                    content += self.pending[: len(self.pending) - keep]
                    self.pending = self.pending[len(self.pending) - keep :]
                    return content, calls
                content += self.pending[:start]
                self.pending, self.state = self.pending[start:], "call"
            if self.state == "call":
                end = self.pending.find(CALL_END)
                if end < 0:
                    return content, calls
                block = self.pending[: end + len(CALL_END)]
                call = parse_call(block[len(CALL_START) : -len(CALL_END)].strip())
                if call is None:
                    content += block
                else:
                    calls.append(call)
                # after a call, the blank lines before the next are not content
                self.pending, self.state = (
                    self.pending[end + len(CALL_END) :],
                    "after" if call is not None else "text",
                )

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The reply ended: a whole llama3 reply is parsed now; unfinished blocks stay content."""
        rest, self.pending = self.pending, ""
        if self.state == "json":
            call = parse_call(rest.strip(), "parameters")
            return ("", [call]) if call is not None else (rest, [])
        return ("" if self.state == "after" else rest), []


def parse_tool_calls(text: str, tool_format: str) -> tuple[str, list[ToolCall]]:
    """A whole answer as (content, calls)."""
    parser = ToolCallParser(tool_format)
    content, calls = parser.push(text)
    more, more_calls = parser.flush()
    return content + more, calls + more_calls
