"""The OpenAI chat-completions stream as :class:`~.reply_source.RemoteEngine` speaks it: the
request body, a stream's chunks added up into the engine's :class:`UserReply`, a remote's error
as a short sentence, an address without its credentials; and a chat's tools as a remote takes
them (:class:`OpenAITools`: ``tools`` and ``tool_choice`` in the request, the streamed
``tool_calls`` joined into the calls the page's tool loop runs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from minisgl_engine import GenerateRequest, ToolCall, UserReply

# a remote's finish reasons that end a reply well, as the page knows them; any other ("abort",
# "error", ...) is shown as a failure
FINISHED = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
}


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part (the page and the log show the address only)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


async def until_stopped(step, stopper: asyncio.Future):
    """``await step``, unless ``stopper`` finishes first: then ``step`` is cancelled and the
    result is None. ``step`` never outlives this call (cancelled here too, it is cancelled)."""
    task = asyncio.ensure_future(step)
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        return None
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class ReasoningJoiner:
    """A remote sends a thinking model's reasoning apart (``reasoning_content``, SGLang's and
    vLLM's field); the page shows replies as the model wrote them, with a <think> block, so
    the two are put back together."""

    def __init__(self) -> None:
        self.thinking = False

    def push(self, content: str | None, reasoning: str | None) -> str:
        out = ""
        if reasoning:
            out += "" if self.thinking else "<think>"
            self.thinking = True
            out += reasoning
        if content:
            out += self.close() + content
        return out

    def close(self) -> str:
        if not self.thinking:
            return ""
        self.thinking = False
        return "</think>"


@dataclass
class ToolsRequest(GenerateRequest):
    """A chat turn that offers tools to a remote: OpenAI's ``tools`` and ``tool_choice``, sent
    as they are (the remote lays them out in its own chat template and parses its model's calls)."""

    tools: list[dict] = field(default_factory=list)
    tool_choice: str | dict = "auto"


@dataclass(frozen=True)
class ToolCallsMade:
    """The calls of a remote's reply (its ``tool_calls`` deltas joined), yielded just before
    the reply's last UserReply."""

    calls: list[ToolCall]


def openai_messages(messages: list[dict]) -> list[dict]:
    """``messages`` as OpenAI's API takes them: a call's arguments as JSON text (the chat's
    turns hold them as objects, which chat templates read)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {**c, "function": {**c["function"], "arguments": _json_text(c["function"])}}
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _json_text(function: dict) -> str:
    args = function.get("arguments")
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class RemoteCalls:
    """A remote reply's calls come apart from its text: ToolCallsMade."""

    def push(self, out: Any) -> tuple[str, list[ToolCall]]:
        if isinstance(out, ToolCallsMade):
            return "", list(out.calls)
        return out.incremental_output, []


@dataclass(frozen=True)
class OpenAITools:
    """A remote OpenAI-compatible server (RemoteEngine.tool_wire): the chat's tools go in the
    request; ``forced``, one tool, is a named ``tool_choice``, several are ``required``."""

    def ask(self, request, messages, tools, forced) -> ToolsRequest:
        choice: str | dict = "auto"
        if len(forced) == 1:
            choice = {"type": "function", "function": {"name": forced[0].name}}
        elif forced:
            choice = "required"
        same = {f.name: getattr(request, f.name) for f in fields(GenerateRequest)}
        same["messages"] = openai_messages(messages)
        return ToolsRequest(**same, tools=[t.openai_tool() for t in tools], tool_choice=choice)

    def reader(self) -> RemoteCalls:
        return RemoteCalls()


def chat_body(request: GenerateRequest, model: str) -> dict:
    """The chat turn as an OpenAI streamed request; top_k and the template's options are the
    extensions SGLang, vLLM and this engine read."""
    p = request.params
    body: dict = {
        "model": model,
        "messages": request.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
    }
    if isinstance(request, ToolsRequest) and request.tools:
        body.update(tools=request.tools, tool_choice=request.tool_choice)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    extra: dict = {}
    if p.top_k is not None and p.top_k > 0:
        extra["top_k"] = p.top_k
    if p.repetition_penalty != 1.0:
        extra["repetition_penalty"] = p.repetition_penalty
    kwargs = dict(request.chat_template_kwargs or {})
    if kwargs.pop(
        "continue_final_message", False
    ):  # Continue: as vLLM and SGLang (and this engine) take it
        extra.update(continue_final_message=True, add_generation_prompt=False)
    if kwargs:
        extra["chat_template_kwargs"] = kwargs
    if extra:
        body["extra_body"] = extra
    return body


def remote_message(exc) -> str:
    """The error message a remote put in its body (OpenAI's shape), shortened."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if message is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    text = str(message or getattr(exc, "message", "") or exc)
    return text if len(text) <= 300 else text[:297] + "…"


@dataclass
class StreamedCall:
    """One call of a remote's reply as its pieces come: the id and name first, the arguments
    in parts (vLLM streams them so; SGLang and this engine send them whole)."""

    id: str = ""
    name: str = ""
    arguments: str = ""

    def add(self, piece) -> None:
        """A ``ChoiceDeltaToolCall``'s part of the call."""
        self.id = piece.id or self.id
        if piece.function is not None:
            self.name += piece.function.name or ""
            self.arguments += piece.function.arguments or ""

    def call(self) -> ToolCall:
        made = ToolCall(self.name, self.arguments or "{}")
        return replace(made, id=self.id) if self.id else made


@dataclass
class ReplyTally:
    """One remote reply as its chunks come: the text (reasoning joined back in a <think> block),
    the tokens counted so far and the finish reason."""

    pieces: ReasoningJoiner = field(default_factory=ReasoningJoiner)
    tokens: int = 0
    finish_reason: str | None = None
    started: bool = False  # a chunk came: a broken connection is then a break mid-reply
    tool_calls: dict[int, StreamedCall] = field(default_factory=dict)  # by the call's index

    def add(self, chunk) -> str:
        """The text ``chunk`` adds (an OpenAI ``ChatCompletionChunk``)."""
        self.started = True
        if not chunk.choices:  # the last chunk of a stream with include_usage
            self.tokens = chunk.usage.completion_tokens if chunk.usage is not None else self.tokens
            return ""
        delta = chunk.choices[0].delta
        # SGLang's and older vLLM's reasoning_content; vLLM now calls it reasoning
        reasoning = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
        text = self.pieces.push(delta.content, reasoning)
        for piece in getattr(delta, "tool_calls", None) or []:  # a call streams in pieces
            self.tool_calls.setdefault(piece.index, StreamedCall()).add(piece)
        if chunk.usage is not None:  # vLLM's continuous usage stats: the count so far
            self.tokens = chunk.usage.completion_tokens or self.tokens
        elif text:
            self.tokens += 1  # a chunk per token from SGLang, vLLM and this engine; `usage` corrects it at the end
        self.finish_reason = chunk.choices[0].finish_reason or self.finish_reason
        return text

    def calls(self) -> ToolCallsMade | None:
        """The reply's calls, once its stream has ended (None: it made none)."""
        if not self.tool_calls:
            return None
        return ToolCallsMade([self.tool_calls[i].call() for i in sorted(self.tool_calls)])

    def stopped(self) -> UserReply | None:
        """What is left to send when Stop closes the stream: an open <think> block's end."""
        return (
            UserReply(0, self.pieces.close(), completion_tokens=self.tokens)
            if self.pieces.thinking
            else None
        )

    def ended(self, where: str) -> UserReply:
        """The last reply once the stream ends: finished, or an error when the remote's finish
        reason is not one that ends a reply well. ``where``: "the remote at URL"."""
        if self.finish_reason in FINISHED:
            return UserReply(
                0,
                self.pieces.close(),
                completion_tokens=self.tokens,
                finished=True,
                finish_reason=FINISHED[self.finish_reason],
            )
        why = (
            f"it ended the reply ({self.finish_reason})"
            if self.finish_reason
            else "it ended the reply without finishing it"
        )
        return self.failed(f"{where}: {why}")

    def failed(self, error: str) -> UserReply:
        return UserReply(
            0, self.pieces.close(), completion_tokens=self.tokens, finished=True, error=error
        )
