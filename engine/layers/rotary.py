"""Rotary position embedding (the rotate-half form used by Llama, Qwen and Mistral), with
Llama 3's frequency scaling. cos/sin are computed once for every position up to the context."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original_len / low, inv_freq / factor, inv_freq)
    blend = (original_len / wavelen - low) / (high - low)
    blended = (1 - blend) * scaled / factor + blend * scaled
    in_band = (wavelen >= original_len / high) & (wavelen <= original_len / low)
    return torch.where(in_band, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass
class RopeInputs:
    """What every layer's rotation needs for one forward pass, computed once: the positions'
    cos and sin ([tokens, 1, dim], torch path; not needed by the fused kernels) and the
    float32 cos|sin table of every position (FlashInfer's and our fused kernels)."""

    positions: torch.Tensor
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    cos_sin_cache: torch.Tensor | None = None


class RotaryEmbedding(nn.Module):
    use_flashinfer = False

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        freqs = (
            torch.arange(max_positions, dtype=torch.float32)[:, None]
            * rope_inv_freq(head_dim, theta, scaling)[None, :]
        )
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)
        # FlashInfer's layout: [positions, dim] float32, cos of each frequency then its sin
        self.register_buffer(
            "cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False
        )

    def prepare(self, positions: torch.Tensor) -> RopeInputs:
        if self.use_flashinfer:
            return RopeInputs(positions, cos_sin_cache=self.cos_sin_cache)
        return RopeInputs(
            positions,
            self.cos[positions].unsqueeze(1),
            self.sin[positions].unsqueeze(1),
            self.cos_sin_cache,
        )


def apply_rotary(x: torch.Tensor, rope: RopeInputs) -> torch.Tensor:
    """x: [tokens, heads, dim] (q and k may be passed together as one tensor of heads)."""
    return x * rope.cos + rotate_half(x) * rope.sin


def apply_rotary_inplace(q: torch.Tensor, k: torch.Tensor, rope: RopeInputs) -> None:
    """FlashInfer's fused rotation of q [tokens, heads, dim] and k in place (views allowed)."""
    import flashinfer

    head_dim = q.shape[-1]
    flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
        rope.positions,
        q.view(q.shape[0], -1),
        k.view(k.shape[0], -1),
        head_dim,
        rope.cos_sin_cache,
        is_neox=True,
    )
