"""Per-request sampling parameters: plain data, validated once when a request is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from .errors import RequestError

GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TOP_LOGPROBS = 20
GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf", "tool_call")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(
        value, bool
    )  # True is an int to Python, not to a request


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class GrammarSpec:
    """Structured output: the text must match this grammar (compiled by xgrammar in the
    scheduler). ``spec`` is the JSON schema (as JSON text), the regex or the EBNF grammar;
    empty for ``json_object`` (any JSON object); for ``tool_call`` (a forced tool call) JSON
    ``{"format": "hermes" | "llama3", "tools": [{"name", "parameters"}]}``."""

    kind: Literal["json_object", "json_schema", "regex", "ebnf", "tool_call"]
    spec: str = ""


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    ``temperature == 0`` (below 1e-5, in fact; or ``top_k == 1``) means greedy. ``top_k <= 0`` and ``top_p == 1``
    disable those filters. ``seed`` makes sampling reproducible for this request alone, whatever
    else shares its batch.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    # OpenAI's penalties (on the tokens generated so far) and vLLM's repetition penalty (on the
    # prompt's tokens too); 0 / 0 / 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest one; 0 = off
    min_tokens: int = 0  # EOS and stop tokens are banned until this many tokens are out
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: bool = False  # return each sampled token's log-probability (the model's, unprocessed)
    top_logprobs: int = 0  # and this many likeliest alternatives (0-20)
    # each prompt token's log-probability given the tokens before it, with this many likeliest
    # alternatives (0-20; vLLM's field); None = off. The prompt is then computed whole (its
    # cached prefix is not reused), since a cached token has no logits
    prompt_logprobs: int | None = None
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        self._check_sampling()
        self._check_logit_edits()
        self._check_outputs()
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    def _check_sampling(self) -> None:
        """The length and how a token is drawn."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not self.temperature >= 0:
            raise RequestError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k):
            raise RequestError(f"top_k must be an integer, got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise RequestError(f"seed must be an integer, got {self.seed!r}")

    def _check_logit_edits(self) -> None:
        """Penalties, min_p, min_tokens and logit_bias; the penalties are stored as floats."""
        for name, low, high in (
            ("frequency_penalty", -2, 2),
            ("presence_penalty", -2, 2),
            ("min_p", 0, 1),
        ):
            value = getattr(self, name)
            if not _is_number(value) or not low <= value <= high:
                raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}")
            setattr(self, name, float(value))
        rp = self.repetition_penalty
        if not _is_number(rp) or not 0 < rp <= 10:
            raise RequestError(f"repetition_penalty must be a number in (0, 10], got {rp!r}")
        self.repetition_penalty = float(rp)
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(
                f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), got {self.min_tokens!r}"
            )
        for token, bias in self.logit_bias.items():
            if not _is_int(token) or token < 0:
                raise RequestError(
                    f"logit_bias keys must be token ids (integers >= 0), got {token!r}"
                )
            if not _is_number(bias) or not -100 <= bias <= 100:
                raise RequestError(
                    f"logit_bias values must be numbers in [-100, 100], got {bias!r} for token {token}"
                )

    def _check_outputs(self) -> None:
        """What comes back besides the tokens (logprobs), and the grammar the text must match."""
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(
                f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.top_logprobs!r}"
            )
        pl = self.prompt_logprobs
        if pl is not None and (not _is_int(pl) or not 0 <= pl <= MAX_TOP_LOGPROBS):
            raise RequestError(
                f"prompt_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {pl!r}"
            )
        if self.grammar is not None and self.grammar.kind not in GRAMMAR_KINDS:
            raise RequestError(
                f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.grammar.kind!r}"
            )

    @cached_property  # read for every request of every step: computed once (replace() makes a new object)
    def has_penalties(self) -> bool:
        """Needs the counts of the tokens seen so far (kept on the device, per request)."""
        return (
            self.frequency_penalty != 0
            or self.presence_penalty != 0
            or self.repetition_penalty != 1
        )

    @cached_property
    def changes_logits(self) -> bool:
        """Anything besides temperature / top-k / top-p that edits this request's logits."""
        return (
            self.has_penalties
            or self.min_p > 0
            or self.min_tokens > 0
            or bool(self.logit_bias)
            or self.grammar is not None
        )

    @property
    def is_greedy(self) -> bool:
        # a temperature this small is greedy in effect; dividing by it would overflow to inf
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1
