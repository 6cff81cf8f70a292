"""Per-request sampling parameters: plain data, validated once when a request is made."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import RequestError

GREEDY_BELOW_TEMPERATURE = 1e-5


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

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise RequestError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise RequestError(f"top_k must be an integer, got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise RequestError(f"seed must be an integer, got {self.seed!r}")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    @property
    def is_greedy(self) -> bool:
        # a temperature this small is greedy in effect; dividing by it would overflow to inf
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1
