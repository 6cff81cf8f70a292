"""The model-side attention layer: projections, q/k norm, RoPE, then the paged backend."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.base import AttentionBackend
from ..batch import ForwardBatch
from ..distributed import get_tp, local_head_counts
from .linear import MergedLinear, RowParallelLinear
from .norm import RMSNorm
from .rotary import RopeInputs, apply_rotary, apply_rotary_inplace


class SelfAttention(nn.Module):
    use_flashinfer = False
    # CUDA with Triton: q/k norms, RoPE and the K/V store in one kernel (triton_kernels.py)
    fused_qk = False
    qk_pdl = (
        False  # ... launched as a programmatic dependent (Hopper; triton_kernels.pdl_supported)
    )

    def __init__(
        self,
        layer_id: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool = False,
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        # this tensor-parallel rank's heads (all of them with one rank)
        local_heads, local_kv_heads, kv_part = local_head_counts(num_heads, num_kv_heads)
        self.num_heads, self.num_kv_heads, self.head_dim = local_heads, local_kv_heads, head_dim
        q_size, kv_size = local_heads * head_dim, local_kv_heads * head_dim
        self.qkv_proj = MergedLinear(
            hidden_size,
            [q_size, kv_size, kv_size],
            ("q", "k", "v"),
            bias=qkv_bias,
            shard_parts=[get_tp().rank, kv_part, kv_part],
        )
        self.o_proj = RowParallelLinear(
            num_heads * head_dim, hidden_size, all_reduce_buffer=0
        )  # the MLP's uses 1
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def forward(
        self, hidden: torch.Tensor, rope: RopeInputs, batch: ForwardBatch, attn: AttentionBackend
    ) -> torch.Tensor:
        return self.attend_qkv(self.qkv_proj(hidden), rope, batch, attn)

    def attend_qkv(
        self, qkv: torch.Tensor, rope: RopeInputs, batch: ForwardBatch, attn: AttentionBackend
    ) -> torch.Tensor:
        """Everything after the merged projection: q/k norm, RoPE, the KV write, attention and
        the output projection."""
        if self.fused_qk:
            from ..kernels.triton_kernels import qk_norm_rope_store

            norms = (
                (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
                if self.q_norm is not None
                else (None, None, 0.0)
            )
            out = attn.decode_from_qkv(qkv, self.layer_id, batch, *norms, rope.cos_sin_cache)
            if out is not None:
                return self.o_proj(out)
            q = qk_norm_rope_store(
                qkv,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                *norms,
                rope.positions,
                rope.cos_sin_cache,
                batch.out_loc,
                attn.kv_pool.k_cache[self.layer_id],
                attn.kv_pool.v_cache[self.layer_id],
                pdl=self.qk_pdl,
            )
            return self.o_proj(attn.attend(q, self.layer_id, batch))
        if self.use_flashinfer:
            return self.o_proj(attn.forward(*self._qkv_fused(qkv, rope), self.layer_id, batch))
        num_qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : num_qk_heads * self.head_dim].view(-1, num_qk_heads, self.head_dim)
        v = qkv[:, num_qk_heads * self.head_dim :].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=1)
        # q and k are adjacent in the merged projection: rotate them in one go
        q, k = apply_rotary(qk, rope).split([self.num_heads, self.num_kv_heads], dim=1)
        return self.o_proj(attn.forward(q, k, v, self.layer_id, batch))

    def _qkv_fused(
        self, qkv: torch.Tensor, rope: RopeInputs
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The CUDA path: per-head norms and RoPE as FlashInfer kernels (3 launches, not ~25)."""
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # new contiguous tensors
            q, k = self.q_norm(q), self.k_norm(k)
        else:  # rotate copies, so the attention kernel gets contiguous q
            q, k = q.contiguous(), k.contiguous()
        apply_rotary_inplace(q, k, rope)
        return q, k, v
