"""Messages between the processes, grouped by the channel they travel on, keyed by ``uid``.

Each is a msgspec Struct encoded as MessagePack: a decoder only ever builds these types from
plain values, so nothing from a socket is unpickled. Every stage drains what is pending and
sends one batch wrapper per channel.

    front end --TokenizerBatch--> tokenizer-i --BackendBatch--> scheduler
    scheduler --DetokenizerBatch--> detokenizer --FrontendBatch--> front end
    scheduler --FrontendBatch(StatsMsg, PromptProgressMsg)--> front end
    tokenizer errors --FrontendBatch--> front end
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

import msgspec

from .sampling_params import SamplingParams


class TokenizeMsg(msgspec.Struct, tag=True):
    """A new request: exactly one of ``text`` (plain prompt), ``messages`` (chat, the model's
    template is applied) or ``input_ids``."""

    uid: int
    params: SamplingParams
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    input_ids: list[int] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    replica: int = 0  # --dp: the replica the front end chose for it


class AbortMsg(msgspec.Struct, tag=True):
    uid: int
    replica: int = 0  # where its request went


class UserMsg(msgspec.Struct, tag=True):
    uid: int
    input_ids: list[int]
    params: SamplingParams


class AbortBackendMsg(msgspec.Struct, tag=True):
    """End a request in the scheduler: the client went away (``stop`` False) or the
    detokenizer found one of its stop strings (``stop`` True: it finished, it was not aborted)."""

    uid: int
    stop: bool = False


class LogprobEntry(msgspec.Struct, array_like=True):
    """A token as OpenAI's logprobs show it: its text, its UTF-8 bytes (a token may hold part of a
    character), its log-probability (None for a prompt's first token, which nothing precedes),
    and the likeliest alternatives."""

    token: str
    token_bytes: list[int]
    logprob: float | None
    top: list[LogprobEntry] = []


class DetokenizeMsg(msgspec.Struct, tag=True):
    uid: int
    next_token: int | None  # None when the request ends without a new token (abort, error)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    stop: list[str] | None = None  # the request's stop strings, sent with its first message
    replica: int = 0  # --dp: the replica that runs it (where a stop string's drop must go)
    logprob: float | None = None  # next_token's, when the request asked for logprobs
    top_logprobs: list[tuple[int, float]] | None = None  # (token id, logprob), likeliest first
    # with the first token, when the request asked for prompt logprobs: per prompt token
    # (token id, logprob or None for the first, alternatives)
    prompt_logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] | None = None


class UserReply(msgspec.Struct, tag=True):
    uid: int
    incremental_output: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[LogprobEntry] | None = None  # one per token this reply adds, when asked for
    prompt_logprobs: list[LogprobEntry] | None = (
        None  # one per prompt token, with the first reply, when asked for
    )


class PromptProgressMsg(msgspec.Struct, tag=True):
    """A prompt read in several prefill chunks: ``done`` of its ``total`` tokens have their KV
    (those found in the prefix cache count). The scheduler sends one as each chunk starts and one
    when the last is done, straight to the front end; a prompt read in one chunk sends none."""

    uid: int
    done: int
    total: int
    # the same in reading cost (``prompt_work``): later tokens cost more, each attending to all
    # before it, so the time left follows the work left, not the tokens (0.0: not counted)
    work_done: float = 0.0
    work_total: float = 0.0


def prompt_work(tokens: int, cost_per_position: float) -> float:
    """The cost of reading a prompt's first ``tokens`` in units of a first token's cost: the
    token at position p costs 1 + p * ``cost_per_position`` (ModelConfig.attention_cost_per_position)."""
    return tokens + cost_per_position * tokens * (tokens - 1) / 2


@dataclass(frozen=True)
class Metric:
    """How a StatsMsg figure shows on /metrics (server/metrics.py reads these): a ``gauge`` or a
    ``counter`` (prometheus_client appends "_total" to a counter's samples: the name has it)."""

    name: str
    kind: str
    help: str


class StatsMsg(msgspec.Struct, tag=True):
    """One replica's load and totals (``replica`` is 0 without --dp). Each figure is declared
    once, here, with its /metrics name and help; ``Scheduler.stats`` fills it in."""

    running: Annotated[
        int,
        Metric(
            "minisgl_running_requests",
            "gauge",
            "Requests admitted: reading their prompt (prefill) or generating.",
        ),
    ]
    waiting: Annotated[
        int, Metric("minisgl_waiting_requests", "gauge", "Requests waiting to be admitted.")
    ]
    kv_pages_total: Annotated[
        int, Metric("minisgl_kv_pages_total", "gauge", "KV cache pages in the pool.")
    ]
    kv_pages_used: Annotated[
        int,
        Metric(
            "minisgl_kv_pages_used",
            "gauge",
            "KV cache pages held by live requests (a cached prefix in use counts).",
        ),
    ]
    kv_pages_cached: Annotated[
        int,
        Metric(
            "minisgl_kv_pages_cached",
            "gauge",
            "KV cache pages held only by the radix prefix cache (evictable).",
        ),
    ]
    kv_pages_free: Annotated[int, Metric("minisgl_kv_pages_free", "gauge", "Free KV cache pages.")]
    prompt_tokens_total: Annotated[
        int,
        Metric(
            "minisgl_prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests taken in, those read from the prefix cache included.",
        ),
    ]
    generation_tokens_total: Annotated[
        int, Metric("minisgl_generation_tokens_total", "counter", "Tokens generated.")
    ]
    requests_finished_total: Annotated[
        int, Metric("minisgl_requests_finished_total", "counter", "Requests finished (any reason).")
    ]
    requests_aborted_total: Annotated[
        int, Metric("minisgl_requests_aborted_total", "counter", "Requests aborted.")
    ]
    prefix_cache_hit_tokens_total: Annotated[
        int,
        Metric(
            "minisgl_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens whose KV came from the prefix cache.",
        ),
    ]
    prompt_tokens_pending: Annotated[
        int,
        Metric(
            "minisgl_prompt_tokens_pending",
            "gauge",
            "Prompt tokens not computed yet, of the requests waiting or reading their prompt.",
        ),
    ] = 0
    replica: int = 0


def stats_metrics() -> list[tuple[str, Metric]]:
    """(field, its Metric) for each figure of StatsMsg, in the order declared."""
    hints = get_type_hints(StatsMsg, include_extras=True)
    return [
        (name, meta)
        for name in StatsMsg.__struct_fields__
        for meta in getattr(hints[name], "__metadata__", ())
        if isinstance(meta, Metric)
    ]


def sum_stats(stats: list[StatsMsg]) -> StatsMsg:
    """The whole engine's figures: every replica's added up."""
    return StatsMsg(**{name: sum(getattr(s, name) for s in stats) for name, _ in stats_metrics()})


class ReadyMsg(msgspec.Struct, tag=True):
    """A worker finished starting (``error`` is None) or failed to (``error`` says why)."""

    worker: str
    error: str | None = None
    info: dict[str, Any] = {}


class StartupMsg(msgspec.Struct, tag=True):
    """What a starting worker is doing now (compiling kernels, capturing graphs), for the UI."""

    worker: str
    phase: str


class TokenizerBatch(msgspec.Struct):
    msgs: list[TokenizeMsg | AbortMsg]


class BackendBatch(msgspec.Struct):
    msgs: list[UserMsg | AbortBackendMsg]


class DetokenizerBatch(msgspec.Struct):
    msgs: list[DetokenizeMsg]


class FrontendBatch(msgspec.Struct):
    msgs: list[UserReply | StatsMsg | PromptProgressMsg | ReadyMsg | StartupMsg]


BATCH_TYPES = (TokenizerBatch, BackendBatch, DetokenizerBatch, FrontendBatch)

_encoder = msgspec.msgpack.Encoder()


def encode(batch) -> bytes:
    return _encoder.encode(batch)


def decoder(batch_type: type) -> msgspec.msgpack.Decoder:
    """A decoder that accepts only ``batch_type``; anything else raises msgspec.DecodeError
    (or msgspec.ValidationError, a subclass), which the receiving worker logs and skips."""
    return msgspec.msgpack.Decoder(batch_type)
