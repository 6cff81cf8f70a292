"""Quantized weights on the GPU: a GGUF's 4- and 8-bit blocks (and ``--quantization int4 |
int8``) kept in the group-code layout our CPU kernels use (``quantized.GroupCodes``) and
multiplied by the Triton kernels of ``kernels/triton_quant.py``, instead of widened to 16 bits.

Batch-1 decode reads every weight once per token, so its speed is the weight bytes over the
memory bandwidth: a 4-bit weight with a float16 scale and offset per 32 inputs is 5 bits a
weight against bf16's 16. Products of a few rows run on the tensor cores with the codes widened
in registers; long prefills widen the weight to the activations' dtype in one kernel and use
cuBLAS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .quantized import GroupCodes, Planes, group_codes

# up to this many rows the tiled kernel widens the codes in registers; above, the weight is
# widened once into memory and cuBLAS multiplies (a long prefill, where the product's arithmetic
# outweighs reading the weight twice)
TILED_MAX_ROWS = 256


class GpuGroupWeight:
    """A [out, in] weight as group codes on the GPU; ``matmul(x)`` is ``x @ weight.T``."""

    def __init__(self, layout: GroupCodes) -> None:
        self.layout = layout
        self.out_features = layout.codes.shape[0]
        self.in_features = layout.scales.shape[1] * 32

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    def widened(self, dtype: torch.dtype) -> torch.Tensor:
        from ..kernels.triton_quant import group_dequantize

        layout = self.layout
        return group_dequantize(layout.codes, layout.scales, layout.mult, layout.kind, dtype)

    def matmul(
        self, x: torch.Tensor, out_dtype: torch.dtype | None = None, silu_mul: bool = False
    ) -> torch.Tensor:
        """``x @ weight.T`` in ``out_dtype`` (default ``x``'s); ``silu_mul``: the weight stacks
        gate and up rows and the result is SwiGLU's ``silu(gate) * up``."""
        if x.shape[0] == 1:
            from ..kernels.triton_quant import group_gemv

            layout = self.layout
            return group_gemv(
                x,
                layout.codes,
                layout.scales,
                layout.mult,
                layout.kind,
                out_dtype=out_dtype,
                silu_mul=silu_mul,
            )
        if x.shape[0] <= TILED_MAX_ROWS:
            from ..kernels.triton_quant import group_matmul

            layout = self.layout
            out = group_matmul(
                x, layout.codes, layout.scales, layout.mult, layout.kind, out_dtype=out_dtype
            )
            if silu_mul:
                gate, up = out.chunk(2, dim=-1)
                out = F.silu(gate) * up
            return out
        out = F.linear(x, self.widened(x.dtype))
        if out_dtype is not None:
            out = out.to(out_dtype)
        if silu_mul:
            gate, up = out.chunk(2, dim=-1)
            out = F.silu(gate) * up
        return out


def gpu_group_weight(planes: Planes, device: torch.device) -> GpuGroupWeight | None:
    """These planes as a GPU weight; None where the group kernels do not take the shape (the
    caller widens the weight instead)."""
    try:
        layout = group_codes(planes)
    except ValueError:
        return None
    return GpuGroupWeight(layout.to(device))
