"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    use_flashinfer = False  # set by the engine on CUDA: one fused kernel instead of ~8

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps
        # Under tensor parallelism with the fused all-reduce on (fused_ops.py), the projection
        # before this norm leaves its all-reduce to it: x is then this rank's partial sum, and
        # this is the one-shot buffer its all-reduce uses when the fused kernel does not fit.
        self.takes_all_reduce: int | None = None

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # already float32: the same arithmetic, fewer ops
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        # Normalise in float32 like the reference implementation, then scale in the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """Without ``residual``: ``norm(x)``. With it: ``(norm(x + residual), x + residual)``.

        x may be [tokens, hidden] or [tokens, heads, head_dim] (Qwen3's per-head q/k norm)."""
        if self.takes_all_reduce is not None and residual is not None:
            from ..distributed import all_reduce, fused_all_reduce_norm

            fused = fused_all_reduce_norm()
            if fused is not None and fused.fits(x):
                return fused(x, residual, self.weight, self.eps)
            x = all_reduce(x, self.takes_all_reduce)
        if self.use_flashinfer:
            import flashinfer

            if residual is None:
                return flashinfer.norm.rmsnorm(x, self.weight, self.eps)
            # in place: residual += x, then x = norm(residual) (x is a fresh product here)
            flashinfer.norm.fused_add_rmsnorm(x, residual, self.weight, self.eps)
            return x, residual
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
