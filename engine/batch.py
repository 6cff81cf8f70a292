"""What one forward pass computes: the scheduler's :class:`Batch` (which requests, how many of
their tokens) and the engine's tensor form of it, :class:`ForwardBatch`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from .request import Req


@dataclass
class Batch:
    """Requests picked by the scheduler for one step.

    ``extend_lens[i]`` tokens of ``reqs[i]`` are computed now, starting at its ``cached_len``:
    the whole remaining prompt, a chunk of it, or the one newest token when decoding.
    """

    phase: Literal["prefill", "decode"]
    reqs: list[Req]
    extend_lens: list[int]
    all_logits: bool = False  # logits for every computed token (teacher-forced scoring)

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"

    def samples(self, i: int) -> bool:
        """Whether request ``i`` gets a new token from this step (a middle chunk does not)."""
        req = self.reqs[i]
        return req.cached_len + self.extend_lens[i] == req.seq_len


@dataclass
class ForwardBatch:
    """Tensors for one forward pass, on the model's device. Built once per step by the engine
    and read by every layer (attention backends plan from it once per step)."""

    phase: Literal["prefill", "decode"]
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    out_loc: torch.Tensor  # [num_tokens] KV slot each new token's K/V is written to
    table_rows: torch.Tensor  # [batch] page-table row of each request
    cached_lens: list[int]  # per request, tokens with KV before this step
    extend_lens: list[int]  # per request, tokens computed in this step
    seq_lens: list[int]  # per request, cached_lens + extend_lens
    logits_indices: torch.Tensor  # rows of the hidden states whose next token is sampled
    attn_metadata: object = field(default=None)  # filled by the attention backend's prepare()
    # A decode batch replayed by a CUDA graph is padded to the graph's size: the tensors above
    # hold ``num_padding`` extra rows (token 0 at position 0, K/V written to the pool's padding
    # page); the list fields describe the real requests only.
    num_padding: int = 0
    use_graph: bool = False  # padded to a CUDA graph's size: planned as that graph's attention
    # prompt logprobs: (batch index, rows) of the requests whose prompt tokens are scored now;
    # their rows follow the sampling rows in ``logits_indices``, ``prompt_targets`` [rows] holds
    # the prompt token each row scores
    scored_prompts: list[tuple[int, int]] = field(default_factory=list)
    prompt_targets: torch.Tensor | None = None
    # [num_tokens] page-table row of each token, padding rows included (row 0): attention
    # kernels that find a request's KV slots in the page table themselves read it
    token_rows: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def padded_size(self) -> int:
        return len(self.seq_lens) + self.num_padding

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"
