"""Linear layers whose parameters know how to load themselves.

Merged projections (QKV, gate/up) are one matrix product instead of three or two; each merged
parameter carries a ``weight_loader`` that copies a checkpoint's separate tensor into its slice,
so the model's loader stays a short loop.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import all_reduce, get_tp
from ..weights.safetensors_io import read_tensor

if TYPE_CHECKING:
    from .quantized import PackedWeight


@functools.cache
def onednn_linear():
    """oneDNN's linear (the kernel torch.compile uses on CPU) runs a float32 matrix-vector
    product ~1.7x faster than ``F.linear``'s default path on a laptop-class CPU, which is most of
    a small model's decode step. It is an internal op: use it only if it exists and agrees.

    Probed at the first product, not at import: the schedulers' fork server imports this module,
    and a product run there starts the OpenMP thread team, which a forked child cannot use (its
    first parallel operation waits forever)."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return None
    try:
        gen = torch.Generator().manual_seed(0)  # the process's own random state stays as it was
        x, w, b = (torch.randn(*shape, generator=gen) for shape in ((3, 16), (8, 16), (8,)))
        if torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5):
            return op
    except (RuntimeError, NotImplementedError):
        pass
    return None


def store_transposed(param: torch.Tensor) -> None:
    """Keep an [out, in] weight's memory as its transpose (a contiguous [in, out]); the shape
    seen by everyone stays [out, in]. On CPU this layout lets one token's product run as two
    half-length products on the two halves of the input, one per core (see ``linear``)."""
    if not param.is_meta:  # a quantized weight's placeholder has no data
        param.data = param.data.t().contiguous().t()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if x.dim() == 2 and x.is_cpu and x.dtype == torch.float32:
        k = weight.shape[1]
        if x.shape[0] == 1 and weight.stride(0) == 1 and k % 2 == 0:
            # One token (batch-1 decode): a matrix-vector product that the BLAS runs on one
            # core. Splitting the reduction in two batched halves keeps both cores busy
            # (~1.35x faster than oneDNN's linear on 2 cores for a small model).
            halves = torch.bmm(x.reshape(2, 1, k // 2), weight.t().view(2, k // 2, weight.shape[0]))
            out = halves[0] + halves[1]
            return out if bias is None else out + bias
        op = onednn_linear()
        if op is not None:
            return op(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


# torch >= 2.8 multiplies 16-bit matrices into a float32 result directly (aten::mm.dtype)
_MM_TO_FLOAT32 = "dtype" in torch.ops.aten.mm.overloads()


def float32_logits(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T`` in float32, the sampler's dtype (into ``out`` when given). On a GPU in
    16-bit the product writes float32 itself from its float32 accumulators: no 16-bit logits
    to round, convert and copy (at batch 256 of a 152k vocabulary, the conversion and the copy
    into the CUDA graph's buffer took 186 us of a 5.7 ms step on an H200)."""
    if _MM_TO_FLOAT32 and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        if out is None:
            return torch.mm(x, weight.t(), out_dtype=torch.float32)
        return torch.mm(x, weight.t(), out_dtype=torch.float32, out=out)
    logits = linear(x, weight).float()
    return logits if out is None else out.copy_(logits)


def default_weight_loader(param: nn.Parameter, loaded, shard_id: str | int | None = None) -> None:
    """``loaded``: a tensor, or a LazySlice read only now (copy_ casts to the parameter's dtype)."""
    if param.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(read_tensor(loaded))


class Linear(nn.Module):
    # On CUDA the engine measures, per layer shape, up to how many rows the Triton kernel
    # (triton_kernels.py) beats cuBLAS, and sets it here; 0 = always cuBLAS. At one row the
    # one-row kernel runs instead where it measured fastest (its GemvPlan; block_n 0 = not used).
    skinny_max_rows = 0
    gemv_plan: tuple[int, int] = (0, 0)  # triton_kernels.GemvPlan: (block_n, per_sm)
    gemv_pdl = False

    # CPU, quantized weights (layers/quantized.py): the packed matrix; ``weight`` is then a
    # meta tensor that keeps only its shape
    quant: PackedWeight | None = None
    # GPU, --quantization fp8 (layers/fp8.py): ``weight`` is float8, this its float32 scale per
    # row, and ``compute_dtype`` the activations' dtype
    weight_scale: torch.Tensor | None = None
    compute_dtype: torch.dtype | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            out = self.quant.matmul(x)
            return out if self.bias is None else out + self.bias
        if x.shape[0] == 1 and self.gemv_plan[0]:
            from ..kernels.triton_kernels import gemv

            return gemv(
                x,
                self.weight,
                self.bias,
                block_n=self.gemv_plan[0],
                per_sm=self.gemv_plan[1],
                pdl=self.gemv_pdl,
                scale=self.weight_scale,
            )
        if self.weight_scale is not None:
            from .fp8 import fp8_linear

            return fp8_linear(x, self.weight, self.weight_scale, self.bias)
        if 0 < x.shape[0] <= self.skinny_max_rows:
            from ..kernels.triton_kernels import skinny_matmul

            return skinny_matmul(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dimension.

    ``shard_names`` name the parts in order (e.g. ``("q", "k", "v")``); loading a part writes
    only its rows. With tensor parallelism (column-parallel) ``out_sizes`` are this rank's
    sizes and ``shard_parts[i]`` says which ``out_sizes[i]``-row block of the checkpoint's
    tensor this rank holds (its rank, or a replicated KV head's index).
    """

    def __init__(
        self,
        in_features: int,
        out_sizes: list[int],
        shard_names: tuple[str, ...],
        bias: bool = False,
        shard_parts: list[int] | None = None,
    ) -> None:
        super().__init__(in_features, sum(out_sizes), bias)
        self.out_sizes = list(out_sizes)
        offsets = [sum(out_sizes[:i]) for i in range(len(out_sizes))]
        parts = shard_parts or [0] * len(out_sizes)
        self.shards = {
            name: (off, size, part)
            for name, off, size, part in zip(shard_names, offsets, out_sizes, parts)
        }
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self._load_shard

    def _load_shard(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        offset, size, part = self.shards[shard_id]
        target = param.data.narrow(0, offset, size)
        if loaded.shape[0] != size and loaded.shape[0] >= (part + 1) * size:
            loaded = loaded.narrow(0, part * size, size)  # this rank's block
        if target.shape != loaded.shape:
            raise ValueError(
                f"shard {shard_id}: parameter {tuple(target.shape)}, checkpoint {tuple(loaded.shape)}"
            )
        target.copy_(read_tensor(loaded))

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return out.split(self.out_sizes, dim=-1)


class RowParallelLinear(Linear):
    """A projection whose input dimension is split across tensor-parallel ranks (attention's
    output and the MLP's down projection): each rank multiplies its slice, an all-reduce sums."""

    def __init__(
        self, in_features: int, out_features: int, all_reduce_buffer: int | None = None
    ) -> None:
        tp = get_tp()
        super().__init__(
            tp.split(in_features, "input features of a row-parallel projection"), out_features
        )
        self.weight.weight_loader = self._load
        self.tp = tp
        self.all_reduce_buffer = (
            all_reduce_buffer  # which one-shot buffer its all-reduce uses (distributed.py)
        )
        self.leaves_all_reduce = (
            False  # the next RMSNorm does it, fused (fused_ops.enable_fused_all_reduce_norm)
        )

    def _load(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        size = param.shape[1]
        if loaded.dim() == 2 and loaded.shape[1] == size * self.tp.size:
            loaded = loaded.narrow(1, self.tp.rank * size, size)
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = super().forward(x)
        return partial if self.leaves_all_reduce else all_reduce(partial, self.all_reduce_buffer)
