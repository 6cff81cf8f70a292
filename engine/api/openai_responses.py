"""The OpenAI-compatible wire format's response bodies: completions, their stream chunks,
logprobs, usage, the model list and errors (the request bodies are in openai_protocol.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..messages import LogprobEntry


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the reply is only tool calls
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    # a thinking model's <think> block (SGLang's and vLLM's field); absent for other models
    reasoning_content: str | None = Field(default=None, exclude_if=lambda value: value is None)


LOWEST_LOGPROB = -9999.0  # what OpenAI reports for an impossible token (JSON has no -inf)


def _logprob(value: float) -> float:
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB


def chat_logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs``: per token its text, logprob, UTF-8 bytes and
    the likeliest alternatives."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": _logprob(e.logprob),
                "bytes": e.token_bytes,
                "top_logprobs": [
                    {"token": t.token, "logprob": _logprob(t.logprob), "bytes": t.token_bytes}
                    for t in e.top
                ],
            }
            for e in entries
        ]
    }


def completion_logprobs(entries: list[LogprobEntry], text_offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (the legacy shape): parallel lists, with each token's
    character offset in the choice's text counted from ``text_offset``. An echoed prompt's first
    token has null for its logprob and alternatives, as OpenAI sends it."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [None if e.logprob is None else _logprob(e.logprob) for e in entries],
        "top_logprobs": [
            None if e.logprob is None else {t.token: _logprob(t.logprob) for t in e.top}
            for e in entries
        ],
        "text_offset": offsets,
    }


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[
        str, Any
    ]  # {"role", "content"} first, then {"content"}, {"reasoning_content"} or {"tool_calls"}, then {} with the finish
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    # Only the last chunk of a stream with include_usage carries usage.
    usage: UsageInfo | None = Field(default=None, exclude_if=lambda usage: usage is None)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = Field(default=None, exclude_if=lambda usage: usage is None)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "minisgl-chat"
    max_model_len: int | None = (
        None  # the context in tokens (vLLM's and SGLang's field), once the model is known
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
