"""A request's state inside the scheduler, with derived lengths instead of loose counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .grammar import GrammarState


PLACEHOLDER = -1  # a sampled token still on its way from the GPU (overlap scheduling)


class FinishReason(str, Enum):
    STOP = "stop"  # EOS or a stop token / string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # the client went away or asked to stop
    ERROR = "error"  # the engine refused or failed the request


@dataclass
class TokenLogprobs:
    """A token's log-probability and the likeliest alternatives, (token id, logprob)."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass(eq=False)
class Req:
    """One request being served.

    ``token_ids`` holds the prompt followed by every generated token; ``cached_len`` counts the
    leading tokens whose KV is already in the pool. So ``extend_len`` is what the next forward
    pass must compute, whether that is a (chunk of a) prompt or the newest generated token.
    """

    uid: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    max_new_tokens: int  # params.max_tokens clamped to the context limit
    table_slot: int = -1  # row of the page table while admitted, -1 while waiting
    cached_len: int = 0
    pages: list[int] = field(default_factory=list)  # KV pages held, in position order
    generator: torch.Generator | None = None  # per-request RNG when a seed is given
    use_prefix_cache: bool = (
        True  # False for teacher-forced scoring, which needs every token's logits
    )
    finish_reason: FinishReason | None = None
    # its prompt takes several prefill chunks: the scheduler reports how far it has read, until
    # it has read the whole prompt
    reports_progress: bool = False
    grammar: GrammarState | None = None  # structured output: where the request is in its grammar
    # params.prompt_logprobs: the logprobs of prompt tokens 1, 2, ... as prefill computes them
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)

    @property
    def output_len(self) -> int:
        return self.seq_len - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    def known_output_ids(self, since: int = 0) -> list[int]:
        """The generated tokens from the ``since``-th on whose values are known (overlap: the
        newest may still be on its way from the GPU). Only those are read: a grammar asks for its
        new tokens at every step."""
        ids, start = self.token_ids, self.prompt_len + since
        end = start
        while end < len(ids) and ids[end] != PLACEHOLDER:
            end += 1
        return ids[start:end]

    @property
    def extend_len(self) -> int:
        return self.seq_len - self.cached_len

    @property
    def scores_prompt(self) -> bool:
        """Whether prefill computes its prompt tokens' logprobs (not again for a prompt
        recomputed after preemption: those were sent with its first token)."""
        return self.params.prompt_logprobs is not None and self.output_len == 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
