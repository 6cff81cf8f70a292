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

import logging

import torch
import torch.nn.functional as F

from .activation import silu_and_mul
from .quantized import GroupCodes, Planes, group_codes

logger = logging.getLogger(__name__)

# up to this many rows the tiled kernel widens the codes in registers; above, the weight is
# widened once into memory and cuBLAS multiplies (a long prefill, where the product's arithmetic
# outweighs reading the weight twice). Measured on an H100 at the Qwen3-8B shapes, 4-bit: at 512
# rows tiled 104 us against widened 151 (qkv), 233 against 294 (down); at 2,048 rows widened wins
TILED_MAX_ROWS = 512


class GpuGroupWeight:
    """A [out, in] weight as group codes on the GPU; ``matmul(x)`` is ``x @ weight.T``."""

    # rows up to which the one-row and the tiled kernels run (check_group_kernels turns off one
    # that this Triton or GPU does not compile or gets wrong: those rows widen the weight)
    one_row_kernel = True
    tiled_max_rows = TILED_MAX_ROWS

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
        if x.shape[0] == 1 and self.one_row_kernel:
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
        if 1 < x.shape[0] <= self.tiled_max_rows:
            from ..kernels.triton_quant import group_matmul

            layout = self.layout
            out = group_matmul(
                x, layout.codes, layout.scales, layout.mult, layout.kind, out_dtype=out_dtype
            )
        else:
            out = F.linear(x, self.widened(x.dtype))
            if out_dtype is not None:
                out = out.to(out_dtype)
        return silu_and_mul(out) if silu_mul else out


def gpu_group_weight(planes: Planes, device: torch.device) -> GpuGroupWeight | None:
    """These planes as a GPU weight; None where the group kernels do not take the shape (the
    caller widens the weight instead)."""
    try:
        layout = group_codes(planes)
    except ValueError:
        return None
    return GpuGroupWeight(layout.to(device))


def check_group_kernels(device: torch.device, dtype: torch.dtype) -> list[str]:
    """Run the one-row and the tiled kernels once on a small matrix against the widened product
    (at load, before CUDA graphs are captured); a kernel that fails to compile here or disagrees
    is turned off for this process and its rows widen the weight instead. Returns what was
    turned off, for the log."""
    from .quantized import int4_planes, int8_planes

    gen = torch.Generator().manual_seed(0)
    turned_off = []
    for planes_of in (int4_planes, int8_planes):
        weight = GpuGroupWeight(
            group_codes(planes_of(torch.randn(64, 128, generator=gen))).to(device)
        )
        for rows, kernel in ((1, "one-row"), (3, "tiled")):
            x = torch.randn(rows, 128, generator=gen).to(device, dtype)
            want = F.linear(x.float(), weight.widened(torch.float32))
            try:
                got = weight.matmul(x).float()
                ok = bool((got - want).abs().max() <= 0.02 * want.abs().max())
            except Exception as exc:  # a compiler or launch error of this Triton/GPU
                logger.warning("the %s group kernel does not run here: %s", kernel, exc)
                ok = False
            if not ok and kernel not in turned_off:
                turned_off.append(kernel)
    if "one-row" in turned_off:
        GpuGroupWeight.one_row_kernel = False
    if "tiled" in turned_off:
        GpuGroupWeight.tiled_max_rows = 1
    return turned_off
