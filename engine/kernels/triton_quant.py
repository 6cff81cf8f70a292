"""GPU products with weights held as 4- or 8-bit codes in groups of 32 inputs (GGUF files kept
quantized, ``--quantization int4 | int8``): the layout our CPU kernels read
(``layers.quantized.GroupCodes``), so both devices share the formats and the loader.

Each group of 32 inputs of a weight row is ``code * scale + offset``. A group's share of a
product is then ``scale * sum(code * x) + offset * sum(x)``: the codes are widened in registers
and the scale and offset applied once per group.

- :func:`group_gemv`: one row (batch-1 decode), which reads every weight once and does little
  else: 4-bit codes are a quarter of a bf16 weight's bytes (plus a float16 scale and offset per
  32). A program reduces ``block_n`` weight rows; with ``silu_mul`` the gate and up rows of a
  merged MLP projection go through SwiGLU in the same kernel.
- :func:`group_matmul`: several rows (batched decode, short prefills): ``tl.dot`` tiles, the
  codes widened in registers step by step.
- :func:`group_dequantize`: many rows (long prefills, where the product's arithmetic outweighs
  reading the weight twice): the weight widened to the activations' dtype by one kernel, then
  cuBLAS's product.

Tests run both under Triton's interpreter on the CPU (``TRITON_INTERPRET=1``) and compiled on
the GPU (tests/gpu/test_triton_kernels.py).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..env import env_choice

GROUP = 32  # inputs per scale and offset
# kernels defined under Triton's interpreter (CPU tests), which runs no PTX: read once, as
# triton.jit itself reads it when the kernels are defined
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# Bytes to float32 in PTX, four per instance: each byte (or its low or high nibble) placed by
# one byte permute under the exponent of 2^23 (0x4B), then 2^23 taken away; exact, and ~2 full-rate
# instructions an input against ~4 with the integer-to-float conversion, which runs at a quarter
# of the float rate or less. The one-row kernel over 4-bit codes is bound by those instructions,
# not by memory: on an H100, Qwen3-8B at int4 went from 268.6 to 298.2 tok/s with it; 8-bit codes
# (half the inputs per byte) measured slower with it in the engine (246.4 against 234.6) and keep
# the conversion (docs/benchmarks.md)
_WIDEN_PTX = """{
.reg .b32 m;
%s
prmt.b32 $0, m, 0x4B000000, 0x7440;
prmt.b32 $1, m, 0x4B000000, 0x7441;
prmt.b32 $2, m, 0x4B000000, 0x7442;
prmt.b32 $3, m, 0x4B000000, 0x7443;
sub.f32 $0, $0, 0f4B000000;
sub.f32 $1, $1, 0f4B000000;
sub.f32 $2, $2, 0f4B000000;
sub.f32 $3, $3, 0f4B000000;
}"""
WIDEN_LOW = tl.constexpr(_WIDEN_PTX % "and.b32 m, $4, 0x0F0F0F0F;")
WIDEN_HIGH = tl.constexpr(_WIDEN_PTX % "shr.b32 m, $4, 4;\nand.b32 m, m, 0x0F0F0F0F;")
WIDEN_BYTE = tl.constexpr(_WIDEN_PTX % "mov.b32 m, $4;")


@triton.jit
def _widen(b, PART: tl.constexpr, PTX: tl.constexpr):
    """Codes from bytes ``b`` (uint8) as float32: ``PART`` 0 the low nibbles, 1 the high ones,
    2 whole bytes. ``PTX``: by :data:`_WIDEN_PTX` (compiled kernels), else by conversion (the
    interpreter runs no PTX)."""
    if PTX:
        if PART == 0:
            asm: tl.constexpr = WIDEN_LOW
        elif PART == 1:
            asm: tl.constexpr = WIDEN_HIGH
        else:
            asm: tl.constexpr = WIDEN_BYTE
        wide = tl.inline_asm_elementwise(
            asm, "=r,=r,=r,=r,r", [b], dtype=tl.float32, is_pure=True, pack=4
        )
    else:
        if PART == 0:
            wide = (b & 15).to(tl.float32)
        elif PART == 1:
            wide = (b >> 4).to(tl.float32)
        else:
            wide = b.to(tl.float32)
    return wide


@triton.jit
def _group_rows_dot(
    x_ptr,
    c_ptr,
    s_ptr,
    rows,
    row_ok,
    K: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PTX: tl.constexpr,
):
    """``sum_k w[row, k] * x[k]`` for ``BLOCK_N`` rows, the weights widened from their codes
    (without the matrix's power-of-two ``mult``; ``PTX``: see :func:`_widen`)."""
    GROUPS: tl.constexpr = K // 32
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if BITS == 4:
        # byte j of a 64-input block: input j in the low nibble, input 32 + j in the high one
        HALF: tl.constexpr = BLOCK_K // 2
        PAIRS: tl.constexpr = HALF // 32
        t = tl.arange(0, HALF)
        low_inputs = (t // 32) * 64 + t % 32
        pair = tl.arange(0, PAIRS)
        for k0 in range(0, K, BLOCK_K):
            b = tl.load(
                c_ptr + rows[:, None] * (K // 2) + (k0 // 2 + t)[None, :],
                mask=row_ok[:, None],
                other=0,
            )
            x_lo = tl.load(x_ptr + k0 + low_inputs).to(tl.float32)
            x_hi = tl.load(x_ptr + k0 + 32 + low_inputs).to(tl.float32)
            dot_lo = tl.sum(
                tl.reshape(_widen(b, 0, PTX) * x_lo[None, :], (BLOCK_N, PAIRS, 32)), axis=2
            )
            dot_hi = tl.sum(
                tl.reshape(_widen(b, 1, PTX) * x_hi[None, :], (BLOCK_N, PAIRS, 32)), axis=2
            )
            sum_lo = tl.sum(tl.reshape(x_lo, (PAIRS, 32)), axis=1)
            sum_hi = tl.sum(tl.reshape(x_hi, (PAIRS, 32)), axis=1)
            so = s_ptr + (rows[:, None] * GROUPS + (k0 // 32 + 2 * pair)[None, :]) * 2
            ok = row_ok[:, None]
            acc += tl.sum(
                tl.load(so, mask=ok, other=0.0).to(tl.float32) * dot_lo
                + tl.load(so + 1, mask=ok, other=0.0).to(tl.float32) * sum_lo[None, :]
                + tl.load(so + 2, mask=ok, other=0.0).to(tl.float32) * dot_hi
                + tl.load(so + 3, mask=ok, other=0.0).to(tl.float32) * sum_hi[None, :],
                axis=1,
            )
    else:
        TILE_GROUPS: tl.constexpr = BLOCK_K // 32
        t = tl.arange(0, BLOCK_K)
        group = tl.arange(0, TILE_GROUPS)
        for k0 in range(0, K, BLOCK_K):
            c = tl.load(
                c_ptr + rows[:, None] * K + (k0 + t)[None, :], mask=row_ok[:, None], other=0
            )
            x = tl.load(x_ptr + k0 + t).to(tl.float32)
            dot = tl.sum(
                tl.reshape(_widen(c, 2, PTX) * x[None, :], (BLOCK_N, TILE_GROUPS, 32)), axis=2
            )
            sums = tl.sum(tl.reshape(x, (TILE_GROUPS, 32)), axis=1)
            so = s_ptr + (rows[:, None] * GROUPS + (k0 // 32 + group)[None, :]) * 2
            ok = row_ok[:, None]
            acc += tl.sum(
                tl.load(so, mask=ok, other=0.0).to(tl.float32) * dot
                + tl.load(so + 1, mask=ok, other=0.0).to(tl.float32) * sums[None, :],
                axis=1,
            )
    return acc


@triton.jit
def _group_gemv_kernel(
    x_ptr,
    c_ptr,
    s_ptr,
    y_ptr,
    N,
    up_offset,
    mult,
    K: tl.constexpr,
    BITS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PTX: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    y = _group_rows_dot(x_ptr, c_ptr, s_ptr, rows, row_ok, K, BITS, BLOCK_N, BLOCK_K, PTX) * mult
    if SILU_MUL:  # the up projection's rows sit ``up_offset`` rows below the gate's
        up = (
            _group_rows_dot(
                x_ptr, c_ptr, s_ptr, rows + up_offset, row_ok, K, BITS, BLOCK_N, BLOCK_K, PTX
            )
            * mult
        )
        y = y * tl.sigmoid(y) * up
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _group_dequantize_kernel(
    c_ptr,
    s_ptr,
    w_ptr,
    N,
    mult,
    K: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    ok = (rows < N)[:, None]
    GROUPS: tl.constexpr = K // 32
    if BITS == 4:
        HALF: tl.constexpr = BLOCK_K // 2
        t = tl.arange(0, HALF)
        low_inputs = k0 + (t // 32) * 64 + t % 32
        b = tl.load(c_ptr + rows[:, None] * (K // 2) + (k0 // 2 + t)[None, :], mask=ok, other=0)
        so = s_ptr + (rows[:, None] * GROUPS + (low_inputs // 32)[None, :]) * 2
        for nibble in tl.static_range(2):
            code = (b >> (4 * nibble)) & 15
            scale = tl.load(so + 2 * nibble, mask=ok, other=0.0).to(tl.float32)
            offset = tl.load(so + 2 * nibble + 1, mask=ok, other=0.0).to(tl.float32)
            w = (code.to(tl.float32) * scale + offset) * mult
            tl.store(
                w_ptr + rows[:, None] * K + (low_inputs + 32 * nibble)[None, :],
                w.to(w_ptr.dtype.element_ty),
                mask=ok,
            )
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        c = tl.load(c_ptr + rows[:, None] * K + ks[None, :], mask=ok, other=0)
        so = s_ptr + (rows[:, None] * GROUPS + (ks // 32)[None, :]) * 2
        scale = tl.load(so, mask=ok, other=0.0).to(tl.float32)
        offset = tl.load(so + 1, mask=ok, other=0.0).to(tl.float32)
        w = (c.to(tl.float32) * scale + offset) * mult
        tl.store(w_ptr + rows[:, None] * K + ks[None, :], w.to(w_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _group_matmul_kernel(
    x_ptr,
    c_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_ym,
    mult,
    K: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """A [BLOCK_M, BLOCK_N] tile of ``x @ W.T`` on the tensor cores: each 64-input step widens
    the tile's two groups of codes to the activations' dtype in registers (no widened copy of
    the weight in memory) and multiplies them with ``tl.dot``."""
    GROUPS: tl.constexpr = K // 32
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = (rows < M)[:, None]
    col_ok = cols < N
    j = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, 64):
        so = s_ptr + (cols * GROUPS + k0 // 32) * 2
        if BITS == 4:
            b = tl.load(
                c_ptr + cols[:, None] * (K // 2) + (k0 // 2 + j)[None, :],
                mask=col_ok[:, None],
                other=0,
            )
            q0 = b & 15
            q1 = b >> 4
        else:
            q = c_ptr + cols[:, None] * K + (k0 + j)[None, :]
            q0 = tl.load(q, mask=col_ok[:, None], other=0)
            q1 = tl.load(q + 32, mask=col_ok[:, None], other=0)
        x0 = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + j)[None, :], mask=row_ok, other=0.0)
        x1 = tl.load(
            x_ptr + rows[:, None] * stride_xm + (k0 + 32 + j)[None, :], mask=row_ok, other=0.0
        )
        for half in tl.static_range(2):
            scale = tl.load(so + 2 * half, mask=col_ok, other=0.0).to(tl.float32) * mult
            offset = tl.load(so + 2 * half + 1, mask=col_ok, other=0.0).to(tl.float32) * mult
            if half == 0:
                w = (q0.to(tl.float32) * scale[:, None] + offset[:, None]).to(
                    x_ptr.dtype.element_ty
                )
                acc += tl.dot(x0, tl.trans(w), input_precision=PRECISION)
            else:
                w = (q1.to(tl.float32) * scale[:, None] + offset[:, None]).to(
                    x_ptr.dtype.element_ty
                )
                acc += tl.dot(x1, tl.trans(w), input_precision=PRECISION)
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=row_ok & col_ok[None, :],
    )


class GroupGemvPlan(NamedTuple):
    """Weight rows per program, inputs per step and warps per program of :func:`group_gemv`,
    and how codes become floats (``ptx``: :data:`_WIDEN_PTX`, else the conversion instruction).
    (Other ways to reduce a 4-bit tile were measured slower at the Qwen3-8B shapes on an H100:
    a tile loaded in three dimensions, each weight scaled before one final reduction, codes read
    as 32-bit words and widened through a float's mantissa with Triton's operations, the next
    step's codes loaded ahead with the decoder's norm inside and PDL; docs/benchmarks.md.)"""

    block_n: int = 4
    block_k: int = 1024
    warps: int = 4
    ptx: bool = True  # codes widened by _widen's PTX (False: by conversion)


# codes one program widens at a time: 64 float32 values per thread at 4 warps, as the 16-bit
# one-row kernel holds
GROUP_TILE_ELEMENTS = 8192


def group_block_k(k: int, block_n: int) -> int:
    """The largest power of two (at least 64) that divides ``k`` and keeps a step within
    GROUP_TILE_ELEMENTS codes."""
    block = 64
    while k % (block * 2) == 0 and block * 2 * block_n <= GROUP_TILE_ELEMENTS:
        block *= 2
    return block


# how the one-row kernel widens codes (``MINISGL_GROUP_WIDEN``: for measuring one against the other)
GROUP_WIDEN = env_choice("MINISGL_GROUP_WIDEN", ("ptx", "convert"))


def default_gemv_plan(k: int, bits: int) -> GroupGemvPlan:
    """``bits``: the codes' (4: widened by PTX, unless ``MINISGL_GROUP_WIDEN=convert``)."""
    return GroupGemvPlan(4, group_block_k(k, 4), 4, bits == 4 and GROUP_WIDEN == "ptx")


def group_gemv(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mult: float,
    bits: int,
    out_dtype: torch.dtype | None = None,
    silu_mul: bool = False,
    plan: GroupGemvPlan | None = None,
) -> torch.Tensor:
    """``x @ W.T`` for one row ``x`` [1, k], ``W`` given by its codes ([n, k / 2] for 4 bits,
    [n, k] for 8) and ``scales`` [n, k / 32, 2] float16, times ``mult``. ``silu_mul``: ``W``
    stacks gate and up rows; the result is ``silu(x @ gate.T) * (x @ up.T)``. The result in
    ``out_dtype`` (default ``x``'s)."""
    m, k = x.shape
    assert m == 1 and x.stride(1) == 1 and k % 64 == 0
    n = codes.shape[0] // 2 if silu_mul else codes.shape[0]
    plan = plan or default_gemv_plan(k, bits)
    y = torch.empty(1, n, dtype=out_dtype or x.dtype, device=x.device)
    _group_gemv_kernel[(triton.cdiv(n, plan.block_n),)](
        x,
        codes,
        scales,
        y,
        n,
        n,
        mult,
        K=k,
        BITS=bits,
        SILU_MUL=silu_mul,
        BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k,
        PTX=plan.ptx and not INTERPRETED,
        num_warps=plan.warps,
    )
    return y


class GroupMatmulTiles(NamedTuple):
    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 3


def group_matmul_tiles(rows: int) -> GroupMatmulTiles:
    """Tiles for ``rows`` activations: few rows need narrow weight tiles, so that enough programs
    stream the weight at once (a 4,096-row weight in 32-row tiles: 128 programs); from 128 rows
    128-row activation tiles (measured on an H100 at the Qwen3-8B shapes, 128 rows: qkv 54 us
    against 139 with 64 x 128 tiles, down 144 against 375; scripts/gpu_group_sweep.py)."""
    if rows <= 16:
        return GroupMatmulTiles(16, 32)
    if rows <= 64:
        return GroupMatmulTiles(rows if rows in (32, 64) else 64, 64)
    return GroupMatmulTiles(128, 64, 4, 4)


def group_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mult: float,
    bits: int,
    out_dtype: torch.dtype | None = None,
    tiles: GroupMatmulTiles | None = None,
) -> torch.Tensor:
    """``x @ W.T`` for ``x`` [m, k] (16-bit), the codes widened tile by tile inside the product."""
    m, k = x.shape
    assert x.stride(1) == 1 and k % 64 == 0
    n = codes.shape[0]
    tiles = tiles or group_matmul_tiles(m)
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    _group_matmul_kernel[(triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n))](
        x,
        codes,
        scales,
        y,
        m,
        n,
        x.stride(0),
        y.stride(0),
        mult,
        K=k,
        BITS=bits,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        # float32 activations (a float32 model) keep float32 products: TF32, Triton's default,
        # rounds the inputs to 10 bits (3e-3 off a float32 product on an H100)
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y


def group_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, mult: float, bits: int, dtype: torch.dtype
) -> torch.Tensor:
    """The weight [n, k] in ``dtype`` from its codes and scales."""
    n = codes.shape[0]
    k = scales.shape[1] * GROUP
    out = torch.empty(n, k, dtype=dtype, device=codes.device)
    block_n, block_k = 16, 64 if k % 128 else 128
    _group_dequantize_kernel[(triton.cdiv(n, block_n), k // block_k)](
        codes, scales, out, n, mult, K=k, BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4
    )
    return out
