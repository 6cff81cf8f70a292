"""What the store hands out and takes in: conversations, messages, their settings and stats, as
frozen dataclasses with no database behind them, and the checks and text helpers on those values.
Every other module of the store imports from here; this one imports none of them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

DEFAULT_TITLE = "New chat"
TITLE_LENGTH = 100
ROLES = ("user", "assistant", "system")
MAX_TOKENS_LIMIT = 32768
SYSTEM_PROMPT_LIMIT = 20_000
# The page's repetition penalty (vLLM's: on the prompt's and the reply's tokens; 1 = off). Small
# models loop without one: the demo model at the page's temperature (0.3) repeats a line of a
# poem to the token limit at 1.0, still at the end of a 512-token poem at 1.1, not at 1.15 (at
# 1.2 it drifts off the question, at 1.3 into nonsense). The OpenAI routes keep 1.0, as other
# servers do. REPETITION_PENALTY_MAX: the page's bound.
DEFAULT_REPETITION_PENALTY = 1.15
REPETITION_PENALTY_MAX = 2.0
STOP_STRINGS_LIMIT = 8
# What a chat does when it is longer than the model's context (app/chat/context_fit.py): keep the
# system prompt and drop the oldest turns until it fits, or stop and say so. The first is the default.
DROP_OLDEST = "drop_oldest"
STOP_AT_CONTEXT = "stop"
CONTEXT_POLICIES = (DROP_OLDEST, STOP_AT_CONTEXT)


class NotFoundError(KeyError):
    """No conversation or message with that id (deleted, or never created)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else "not found"


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation generation settings."""

    system_prompt: str = ""
    temperature: float = 0.3
    top_p: float = 0.9
    max_tokens: int = 512
    thinking: bool = False
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None  # None: a new random draw each reply
    stop: tuple[str, ...] = ()  # the reply ends before any of these strings
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY  # 1: off
    backend: str | None = (
        None  # where replies come from when the app has several ("local", "remote"); None: the first
    )
    context_policy: str = DROP_OLDEST  # a chat longer than the context: one of CONTEXT_POLICIES
    # MCP tools (app/chat/tool_loop.py), each "server/tool": those the model is offered, and
    # those that run without asking (the user chose "Always allow this tool")
    tools: tuple[str, ...] = ()
    always_allow: tuple[str, ...] = ()
    # "auto": the model decides; "required": it must call one of the tools; a tool's
    # "server/tool": it must call that one (in the first round of each reply)
    tool_choice: str = "auto"

    def problems(self) -> dict[str, str]:
        """Each invalid value's field name and what is wrong with it, in words a user can act on."""
        problems = {}
        if not isinstance(self.system_prompt, str):
            problems["system_prompt"] = "system prompt must be text"
        elif len(self.system_prompt) > SYSTEM_PROMPT_LIMIT:
            problems["system_prompt"] = (
                f"system prompt is {len(self.system_prompt):,} characters; "
                f"the limit is {SYSTEM_PROMPT_LIMIT:,}"
            )
        if not is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            problems["temperature"] = (
                f"temperature must be between 0 and 2 (got {shown_value(self.temperature)})"
            )
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            problems["top_p"] = (
                f"top-p must be greater than 0 and at most 1 (got {shown_value(self.top_p)})"
            )
        if not is_whole(self.max_tokens) or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            problems["max_tokens"] = (
                f"max tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT:,} (got {shown_value(self.max_tokens)})"
            )
        if not isinstance(self.thinking, bool):
            problems["thinking"] = f"thinking must be on or off (got {shown_value(self.thinking)})"
        if not is_whole(self.top_k) or not 0 <= self.top_k <= 1000:
            problems["top_k"] = (
                f"top-k must be a whole number from 0 (off) to 1000 (got {shown_value(self.top_k)})"
            )
        if self.seed is not None and (not is_whole(self.seed) or not 0 <= self.seed < 2**63):
            problems["seed"] = (
                f"seed must be empty or a whole number from 0 to 2^63-1 (got {shown_value(self.seed)})"
            )
        if (
            not is_number(self.repetition_penalty)
            or not 1.0 <= self.repetition_penalty <= REPETITION_PENALTY_MAX
        ):
            problems["repetition_penalty"] = (
                f"repetition penalty must be between 1 (off) and {REPETITION_PENALTY_MAX:g} "
                f"(got {shown_value(self.repetition_penalty)})"
            )
        if (
            not isinstance(self.stop, tuple)
            or len(self.stop) > STOP_STRINGS_LIMIT
            or not all(isinstance(x, str) and 0 < len(x) <= 100 for x in self.stop)
        ):
            problems["stop"] = (
                f"stop strings: at most {STOP_STRINGS_LIMIT}, each 1 to 100 characters"
            )
        if self.backend is not None and (
            not isinstance(self.backend, str) or not 0 < len(self.backend) <= 40
        ):
            problems["backend"] = (
                f"replies from: expected the name of a backend (got {shown_value(self.backend)})"
            )
        if self.context_policy not in CONTEXT_POLICIES:
            problems["context_policy"] = (
                f"a chat longer than the context: expected one of {', '.join(CONTEXT_POLICIES)} "
                f"(got {shown_value(self.context_policy)})"
            )
        problems.update(self._tool_problems())
        return problems

    def _tool_problems(self) -> dict[str, str]:
        problems = {}
        for name in ("tools", "always_allow"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                isinstance(x, str) and 0 < len(x) <= 200 and "/" in x for x in value
            ):
                problems[name] = f"{name}: expected tools named server/tool"
        if self.tool_choice not in ("auto", "required") and (
            not isinstance(self.tool_choice, str) or self.tool_choice not in self.tools
        ):
            problems["tool_choice"] = (
                f"tool choice: auto, required or one of the chat's tools "
                f"(got {shown_value(self.tool_choice)})"
            )
        return problems

    def validate(self) -> None:
        """Raise ValueError naming every invalid value (see ``problems``)."""
        if problems := self.problems():
            raise ValueError("; ".join(problems.values()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatSettings:
        """Known keys only; missing keys take their defaults (files written by other versions)."""
        known = _known_fields(cls, data)
        for name in ("stop", "tools", "always_allow"):
            if isinstance(known.get(name), list):  # JSON has no tuples
                known[name] = tuple(known[name])
        return cls(**known)


@dataclass(frozen=True)
class MessageStats:
    """What the UI shows under a reply; ``stopped`` is set when the user pressed Stop. A question
    has stats only when it was left ``unanswered``: the chat stopped before its turn came and a
    later question was sent (the model does not see it then; view.left_unanswered)."""

    ttft_ms: float | None = None
    tok_s: float | None = None
    tokens: int | None = None
    finish_reason: str | None = None
    stopped: bool = False
    stopped_by: str | None = None  # why it stopped when not by the user, e.g. "switch to <model>"
    unanswered: bool = False  # a question: left without a reply (see above)
    # a question left unanswered because the chat was past the model's context (its policy is
    # "stop"): the chat's length in tokens then; ↻ answers it with the oldest turns dropped
    over_context: int | None = None
    # a reply: the first message of the chat that the model read (the turns before it were
    # dropped to fit the context); None: it read the whole chat
    read_from: int | None = None
    # a reply the user wrote over (✎): no figures, the model did not write this version
    edited: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MessageStats:
        return cls(**_known_fields(cls, data))

    def summary(self) -> str:
        """The line under a reply, on the page and in a Markdown export: "0.12 s to first token
        · 35.2 tok/s · 120 tokens", then how it ended if not by itself ("hit the token limit",
        "stopped")."""
        parts = ["not answered"] if self.unanswered else []
        if self.edited:
            parts.append("edited by you")
        if self.ttft_ms is not None:
            parts.append(f"{self.ttft_ms / 1000:.2f} s to first token")
        if self.tok_s is not None:
            parts.append(f"{self.tok_s:.1f} tok/s")
        if self.tokens is not None:
            parts.append(f"{self.tokens} {plural('token', self.tokens)}")
        if self.stopped:
            parts.append(f"stopped ({self.stopped_by})" if self.stopped_by else "stopped")
        elif self.finish_reason == "length":
            parts.append("hit the token limit")
        return " · ".join(parts)


TOOL_CALL_STATES = ("waiting", "running", "done", "error", "denied", "stopped")


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call the model made in a reply, kept with the reply so it survives a reload and
    an export: what was called, where in the reply's text, what the user decided and what came
    back (``result``: the tool's text, an error, or why it did not run)."""

    id: str  # the call's id, which its ``tool`` message answers
    tool: str  # "server/tool"
    arguments: str  # JSON text, as the model wrote it
    offset: int  # the reply's text before the call: content[:offset]
    state: str = "waiting"  # one of TOOL_CALL_STATES
    result: str = ""

    @property
    def name(self) -> str:
        """The tool's own name (what the model calls it)."""
        return self.tool.split("/", 1)[-1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCallRecord:
        """From stored or imported JSON; ValueError for a record that is not one."""
        record = cls(**_known_fields(cls, dict(data)))
        if not all(isinstance(x, str) for x in (record.id, record.tool, record.arguments)):
            raise ValueError("a tool call's id, tool and arguments are text")
        if not is_whole(record.offset) or record.offset < 0:
            raise ValueError("a tool call's offset is a whole number")
        if record.state not in TOOL_CALL_STATES or not isinstance(record.result, str):
            raise ValueError(f"a tool call's state is one of {', '.join(TOOL_CALL_STATES)}")
        return record


def tool_calls_json(calls: tuple[ToolCallRecord, ...] | None) -> str | None:
    """A reply's tool calls as the database stores them (None: none)."""
    return json.dumps([c.to_dict() for c in calls]) if calls else None


def tool_calls_from_json(stored: str | None) -> tuple[ToolCallRecord, ...]:
    return tuple(ToolCallRecord.from_dict(d) for d in json.loads(stored)) if stored else ()


@dataclass(frozen=True)
class ToolServerRecord:
    """An MCP server the user added in the Tools panel: a stdio ``command`` (run with the
    user's rights) or a streamable-HTTP ``url``."""

    id: int
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None


@dataclass(frozen=True)
class Message:
    """One node of a conversation's tree. ``sibling_index``/``sibling_count`` place it among the
    versions that share its parent (oldest first), so the UI can show ‹ 2/3 ›; they are filled
    in on messages read back by ``get``, ``append`` and ``add_message``."""

    id: int
    conversation_id: int
    position: int  # depth in the tree: 0, 1, 2, ... along the shown path
    role: str  # 'user' | 'assistant' | 'system'
    content: str
    created_at: float  # unix seconds
    stats: MessageStats | None = None
    parent_id: int | None = None  # None for a first message (one of the root versions)
    sibling_index: int = 0
    sibling_count: int = 1
    model: str | None = (
        None  # a reply: the model that wrote it (None: unknown, e.g. stored before schema 4)
    )
    tool_calls: tuple[ToolCallRecord, ...] = ()  # a reply: the tools it called, in order


@dataclass(frozen=True)
class ConversationSummary:
    """One row of the sidebar (or of search results, with ``snippet`` from the matching text)."""

    id: int
    title: str
    created_at: float
    updated_at: float
    message_count: int  # messages on the shown path
    snippet: str = ""  # search only: a few words around a match in a message; "" for a title hit


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    settings: ChatSettings
    messages: list[Message] = field(default_factory=list)
    revision: int = 0  # its write count when read (ConversationStore.revision)


# Stats may be given as a MessageStats or a dict with the same keys; they are read back as MessageStats.
StatsLike = MessageStats | Mapping[str, Any]


def default_settings() -> ChatSettings:
    """The settings a new conversation starts with."""
    return ChatSettings()


def title_from(text: str) -> str:
    """A sidebar title from a first user message: its first non-blank line, at most TITLE_LENGTH characters
    (the sidebar cuts it in its middle, keeping its last words: questions that start alike differ there)."""
    line = next((" ".join(ln.split()) for ln in text.splitlines() if ln.strip()), "")
    if len(line) > 4 and line.startswith("**") and line.endswith("**"):
        # a line all in bold: a file sent alone starts with its name so (ui.with_attachments), and
        # the sidebar shows titles as plain text, where the asterisks would show
        line = line[2:-2].strip() or line
    if not line:
        return DEFAULT_TITLE
    if len(line) <= TITLE_LENGTH:
        return line
    cut = line[: TITLE_LENGTH - 1]
    space = cut.rfind(" ")
    if space >= TITLE_LENGTH // 2:  # end on a whole word when that loses little
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def check_message(role: str, content: str) -> None:
    """ValueError for an unknown role, TypeError for content that is not text: checked before a
    write, so nothing is stored."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)} (got {role!r})")
    if not isinstance(content, str):
        raise TypeError(f"message content must be a str (got {type(content).__name__})")


def stats_json(stats: StatsLike | None) -> str | None:
    """Stats as the database stores them: MessageStats as JSON, or None."""
    if stats is None:
        return None
    if isinstance(stats, Mapping):
        stats = MessageStats(**stats)  # unknown keys are a TypeError, not silently stored
    return json.dumps(stats.to_dict())


def stats_dict(stored: str | None) -> dict[str, Any] | None:
    """Stored stats as a dict with every field of MessageStats (keys of other versions dropped)."""
    return MessageStats.from_dict(json.loads(stored)).to_dict() if stored is not None else None


def plural(noun: str, n: int) -> str:
    """``noun`` as it follows the number ``n``: "1 token", "120 tokens"."""
    return noun if n == 1 else noun + "s"


def shown_value(value: object) -> str:
    """A value quoted for an error message, cut short; a number as people write it (5, not 5.0;
    40,000; 1e+20, not its 21 digits)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if abs(value) >= 1e15:
            return f"{value:.3g}"
        if isinstance(value, int) or value.is_integer():
            return f"{int(value):,}"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def is_whole(x: object) -> bool:
    """An int that is not a bool (JSON's true is not a count)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}
