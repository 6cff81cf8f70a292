"""The attention backend interface: plan once per batch, then attend once per layer."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..batch import ForwardBatch
from ..kvcache.kv_pool import KVPool
from ..kvcache.page_table import PageTable


class AttentionBackend(ABC):
    def __init__(
        self,
        kv_pool: KVPool,
        page_table: PageTable,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        self.kv_pool = kv_pool
        self.page_table = page_table
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Compute whatever every layer will reuse for this batch (indices, masks, plans) and
        store it in ``batch.attn_metadata``."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """Store the new tokens' K/V in the pool, then attend.

        q: [tokens, num_heads, head_dim]; k, v: [tokens, num_kv_heads, head_dim].
        Returns [tokens, num_heads * head_dim].
        """

    @abstractmethod
    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        """Attend when this step's K/V are already in the pool (written by a fused kernel)."""

    def decode_from_qkv(
        self,
        qkv: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor | None:
        """Where this backend has one kernel for a whole decode step's attention straight from
        the merged projection (q/k norm, RoPE, the K/V write, attention): its output
        [tokens, num_heads * head_dim]; otherwise None, and the layer runs the steps itself."""
        return None
