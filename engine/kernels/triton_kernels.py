"""Fused GPU kernels (Triton) for the small-batch steps that dominate a chat.

A decode step of a 0.6B model at batch 1 was ~430 kernels on an H200: each costs about 2 µs even
inside a CUDA graph, and cuBLAS streams the small per-layer weight matrices at a fraction of the memory bandwidth
when the product has a single row. These kernels cut that down:

- :func:`matmul` / :func:`skinny_matmul`: ``x @ W.T`` in output tiles of a chosen size (up to 16
  rows: one pass over the weights), optionally with SwiGLU's ``silu(gate) * up`` fused in, so
  the MLP's activation kernel disappears. The engine uses it only where it measured it faster
  than cuBLAS (:mod:`..fused_ops`).
- :func:`gemv` / :func:`add_norm_gemv`: the same for exactly one row (batch-1 decode), a few
  weight rows per program so that every SM streams weights; optionally with the decoder's
  residual add + RMSNorm computed in front (each program normalises the one row itself), and on
  Hopper launched early, reading its first weights while the previous kernel finishes. Two
  ways to cover the weight (:class:`GemvPlan`): a program per few rows, or a few programs per
  SM that keep the input row in registers and walk the rows (large products, the norm inside).
- :func:`qk_norm_rope_store`: Qwen3's per-head q/k RMSNorm, RoPE and the write of K and V into
  the KV pool in one launch (five kernels before: two norms, RoPE, two index copies).
- :func:`fill_kv_indices`: FlashInfer's page list of a batch, gathered from the page table in
  one launch (eight small tensor ops before).

Everything is computed in float32 and rounded once to the model's dtype. Tests run them under
Triton's interpreter on the CPU (``TRITON_INTERPRET=1``) and compiled on the GPU.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..env import env_choice, env_ints

SKINNY_MAX_ROWS = 16  # tl.dot's smallest tile: every row count up to it costs one pass


@triton.jit
def _matmul_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    stride_xm,
    stride_ym,
    stride_wn,
    stride_wk,
    up_offset,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0
        )
        w = tl.load(
            w_ptr + cols[:, None] * stride_wn + (k0 + ks)[None, :] * stride_wk,
            mask=col_ok[:, None],
            other=0.0,
        )
        acc += tl.dot(x, tl.trans(w))
        if SILU_MUL:  # the up projection's rows sit ``up_offset`` rows below the gate's
            w_up = tl.load(
                w_ptr + (cols[:, None] + up_offset) * stride_wn + (k0 + ks)[None, :] * stride_wk,
                mask=col_ok[:, None],
                other=0.0,
            )
            acc_up += tl.dot(x, tl.trans(w_up))
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        acc = acc * tl.sigmoid(acc) * acc_up
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


def skinny_block_k(k: int) -> int | None:
    """The K tile for a reduction of length ``k`` (None: no tile divides it)."""
    for block in (256, 128, 64, 32, 16):
        if k % block == 0:
            return block
    return None


class MatmulTiles(NamedTuple):
    """How :func:`matmul` covers its product: rows and columns of the output per program, the
    reduction's step, warps per program and the loads in flight (Triton's pipeline stages)."""

    block_m: int = 16
    block_n: int = 16
    block_k: int = 0  # 0: the largest of skinny_block_k's tiles that divides the reduction
    warps: int = 4
    stages: int = 4


DEFAULT_TILES = MatmulTiles()


def matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    tiles: MatmulTiles = DEFAULT_TILES,
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` tiled as ``tiles`` says; with ``silu_mul`` the weight is a merged
    [gate; up] matrix and the result is ``silu(x @ gate.T) * (x @ up.T)`` (SwiGLU's activation
    kernel and its [rows, 2 * inter] intermediate never exist)."""
    m, k = x.shape
    assert x.stride(1) == 1 and weight.shape[1] == k
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_k = tiles.block_k or skinny_block_k(k)
    assert block_k is not None and k % block_k == 0, f"no K tile divides {k}"
    _matmul_kernel[(triton.cdiv(n, tiles.block_n), triton.cdiv(m, tiles.block_m))](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        m,
        n,
        x.stride(0),
        y.stride(0),
        weight.stride(0),
        weight.stride(1),
        n,
        K=k,
        HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=block_k,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y


def skinny_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    block_n: int = 16,
) -> torch.Tensor:
    """:func:`matmul` for ``x`` of at most 16 rows: one program per ``block_n`` columns, one pass
    over the weights.

    Triton compiles it once per model shape and row-count class (1, a multiple of 16, other),
    all of them during the engine's start-up measurement."""
    assert x.shape[0] <= SKINNY_MAX_ROWS
    return matmul(x, weight, bias, silu_mul, MatmulTiles(block_n=block_n))


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper and later, and a Triton that can ask for it): a
    kernel starts while the one before it finishes, reads what does not depend on it (its
    weights), and waits for the earlier kernel's results only when it needs them."""
    if (
        device.type != "cuda"
        or os.environ.get("TRITON_INTERPRET") == "1"
        or torch.cuda.get_device_capability(device)[0] < 9
    ):
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


# Where a kernel launched as a programmatic dependent lets the next kernel launch
# (``MINISGL_PDL_TRIGGER``): ``early`` once the kernel before it is complete (its own wait
# returned), ``first`` before that wait (a chain of short kernels is launched while the product in
# front of it still runs; each still waits for the one before, and that one for its own, so the
# order of results holds), ``late`` (the default) after the kernel's main loop, ``rowslate``: late
# in the row-walking products only, early elsewhere. Qwen3-8B at batch 1 on an H200: early 214,
# late 236 tok/s (docs/benchmarks.md, eighth round): the next kernel's programs, launched early,
# wait on the SMs beside a product that still streams its weights.
_PDL_MODE = env_choice("MINISGL_PDL_TRIGGER", ("rowslate", "late", "early", "first"))
_TRIGGER_CODE = {"early": 0, "first": 1, "late": 2}  # as _pdl_wait and _pdl_done read them
PDL_TRIGGER = tl.constexpr(_TRIGGER_CODE.get(_PDL_MODE, 0))  # rowslate: early here
PDL_ROWS_TRIGGER = tl.constexpr(
    _TRIGGER_CODE.get(_PDL_MODE, 2)
)  # the row-walking products' (rowslate: late)


@triton.jit
def _pdl_wait(USE_PDL: tl.constexpr, TRIGGER: tl.constexpr):
    """Wait for the kernel before (a programmatic dependent's inputs are complete only after
    this), letting the next kernel launch where ``TRIGGER`` says (:data:`PDL_TRIGGER`)."""
    if USE_PDL:
        if TRIGGER == 1:
            tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
        if TRIGGER == 0:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _pdl_done(USE_PDL: tl.constexpr, TRIGGER: tl.constexpr):
    """The end of a kernel's main loop: with ``TRIGGER`` ``late``, the next kernel may launch."""
    if USE_PDL:
        if TRIGGER == 2:
            tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gemv_input(x_ptr, r_ptr, h_ptr, g_ptr, offs, write_h, NORM: tl.constexpr):
    """One K tile of the product's input: ``x``, or with ``NORM`` the decoder's ``h = x +
    residual`` (rounded to the model's dtype like a separate add; ``write_h``: this program
    stores it as the next residual) times the norm's weight. Returns the tile and its share
    of the sum of squares the norm divides by (0 without ``NORM``)."""
    x = tl.load(x_ptr + offs).to(tl.float32)
    if NORM:
        h = (x + tl.load(r_ptr + offs).to(tl.float32)).to(h_ptr.dtype.element_ty)
        if write_h:
            tl.store(h_ptr + offs, h)
        x = h.to(tl.float32)
        return x * tl.load(g_ptr + offs).to(tl.float32), tl.sum(x * x, axis=0)
    return x, 0.0


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    r_ptr,
    h_ptr,
    g_ptr,
    s_ptr,
    eps,
    N,
    stride_wn,
    stride_wk,
    up_offset,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    w_tile = w_ptr + cols[:, None] * stride_wn + ks[None, :] * stride_wk
    # the first weight tile does not depend on the kernel before: read it before waiting for it
    w = tl.load(w_tile, mask=col_ok[:, None], other=0.0)
    if SILU_MUL:  # the up projection's rows sit ``up_offset`` rows below the gate's
        w_up = tl.load(w_tile + up_offset * stride_wn, mask=col_ok[:, None], other=0.0)
    _pdl_wait(USE_PDL, PDL_TRIGGER)  # the previous kernel's output (x) is complete from here on
    x, sum_sq = _gemv_input(x_ptr, r_ptr, h_ptr, g_ptr, ks, pid == 0, NORM)
    acc = w.to(tl.float32) * x[None, :]
    if SILU_MUL:
        acc_up = w_up.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        x, part = _gemv_input(x_ptr, r_ptr, h_ptr, g_ptr, k0 + ks, pid == 0, NORM)
        if NORM:
            sum_sq += part
        acc += (
            tl.load(w_tile + k0 * stride_wk, mask=col_ok[:, None], other=0.0).to(tl.float32)
            * x[None, :]
        )
        if SILU_MUL:
            acc_up += (
                tl.load(
                    w_tile + up_offset * stride_wn + k0 * stride_wk, mask=col_ok[:, None], other=0.0
                ).to(tl.float32)
                * x[None, :]
            )
    _pdl_done(USE_PDL, PDL_TRIGGER)
    y = tl.sum(acc, axis=1)
    if SILU_MUL:
        y_up = tl.sum(acc_up, axis=1)
    if NORM:  # the norm's 1 / rms is one number per row: it scales the product's result
        inv_rms = 1.0 / tl.sqrt(sum_sq / K + eps)
        y = y * inv_rms
        if SILU_MUL:
            y_up = y_up * inv_rms
    if HAS_SCALE:  # FP8 weights: each weight row's scale
        y = y * tl.load(s_ptr + cols, mask=col_ok, other=0.0)
        if SILU_MUL:
            y_up = y_up * tl.load(s_ptr + up_offset + cols, mask=col_ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if SILU_MUL:
        y = y * tl.sigmoid(y) * y_up
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _gemv_rows_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    r_ptr,
    h_ptr,
    g_ptr,
    s_ptr,
    eps,
    N,
    stride_wn,
    up_offset,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """:func:`gemv` with ``per_sm``: a fixed grid, each program holding the whole input row in
    registers (normalised once) and walking the weight ``BLOCK_N`` rows at a time, the next
    rows' loads issued before this step's sums."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_N
    ks = tl.arange(0, K_PAD)
    k_ok = ks < K
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = w_ptr + cols[:, None] * stride_wn + ks[None, :]
    mask = (cols < N)[:, None] & k_ok[None, :]
    # the first rows do not depend on the kernel before: read them before waiting for it
    w = tl.load(w_rows, mask=mask, other=0.0)
    w_up = w
    if SILU_MUL:  # the up projection's rows sit ``up_offset`` rows below the gate's
        w_up = tl.load(w_rows + up_offset * stride_wn, mask=mask, other=0.0)
    _pdl_wait(
        USE_PDL, PDL_ROWS_TRIGGER
    )  # the previous kernel's output (x) is complete from here on
    x = tl.load(x_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
    scale = 1.0
    if NORM:  # h = x + residual, rounded like a separate add; program 0 stores it
        h = (x + tl.load(r_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)).to(
            h_ptr.dtype.element_ty
        )
        if pid == 0:
            tl.store(h_ptr + ks, h, mask=k_ok)
        x = h.to(tl.float32)
        scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
        x = x * tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
    for start in range(pid * BLOCK_N, N, step):
        cols = start + tl.arange(0, BLOCK_N)
        w_rows += step * stride_wn
        mask = (cols + step < N)[:, None] & k_ok[None, :]
        w_next = tl.load(w_rows, mask=mask, other=0.0)
        w_up_next = w_next
        if SILU_MUL:
            w_up_next = tl.load(w_rows + up_offset * stride_wn, mask=mask, other=0.0)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1) * scale
        if HAS_SCALE:  # FP8 weights: each weight row's scale
            y = y * tl.load(s_ptr + cols, mask=cols < N, other=0.0)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if SILU_MUL:
            y_up = tl.sum(w_up.to(tl.float32) * x[None, :], axis=1) * scale
            if HAS_SCALE:
                y_up = y_up * tl.load(s_ptr + up_offset + cols, mask=cols < N, other=0.0)
            y = y * tl.sigmoid(y) * y_up
        tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)
        w = w_next
        w_up = w_up_next
    _pdl_done(USE_PDL, PDL_ROWS_TRIGGER)


GEMV_TILE_ELEMENTS = (
    8192  # 16-bit weights one program holds in registers at a time (64 per thread at 4 warps)
)
GEMV_TILE_BYTES = 2 * GEMV_TILE_ELEMENTS  # the same bytes for FP8 weights: twice the elements


class GemvPlan(NamedTuple):
    """How :func:`gemv` covers a weight, as measured fastest for its shape (fused_ops).

    ``block_n``: weight rows a program reduces at a time (0: the one-row kernel is not used).
    ``per_sm`` 0: a program per ``block_n`` rows, reducing K in tiles; every program reads the
    whole input row (with the norm inside: x, the residual and the norm's weight). ``per_sm`` >
    0: that many programs per SM, each reading the input once and walking the rows: far less
    input traffic, which a large product with the norm inside needs to stream at the read
    bandwidth (Qwen3-8B's gate_up on an H200: 54.7 -> 46.5 us)."""

    block_n: int = 0
    per_sm: int = 0


def gemv_block_k(k: int, block_n: int, element_size: int = 2) -> int | None:
    """The K tile of :func:`gemv` for rows of length ``k``: the largest power of two that divides
    ``k`` and keeps a tile within GEMV_TILE_BYTES of weights of ``element_size`` bytes (None:
    none does). (FP8 weights at twice the elements: measured 6-25% faster at the Qwen3-8B
    shapes on an H100, docs/benchmarks.md.)"""
    block = 1
    while k % (block * 2) == 0 and block * 2 * block_n * element_size <= GEMV_TILE_BYTES:
        block *= 2
    return block if block >= 16 else None


def gemv_rows_warps(k: int, block_n: int, silu_mul: bool, element_size: int = 2) -> int:
    """Warps of a program of the row-walking kernel: enough that its rows (and the prefetched
    next ones) stay within about GEMV_TILE_BYTES x 2 per 4 warps, at most 16."""
    weights = triton.next_power_of_2(k) * block_n * (2 if silu_mul else 1) * element_size
    return min(16, max(4, 4 * weights // (2 * GEMV_TILE_BYTES)))


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    block_n: int = 4,
    pdl: bool = False,
    per_sm: int = 0,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for one row ``x`` [1, k] (batch-1 decode), with SwiGLU fused in
    as in :func:`skinny_matmul`. Unlike it, no tensor-core tile of 16 rows: each program reduces
    ``block_n`` weight rows, so even a projection with few outputs spreads over every SM.
    ``per_sm``: the row-walking grid (:class:`GemvPlan`). ``pdl``: launched as a programmatic
    dependent (see :func:`pdl_supported`). ``scale``: an FP8 weight's float32 scale per row (the
    weight is read as 8 bits, widened in registers: half the bytes of a 16-bit weight)."""
    return _launch_gemv(x, weight, bias, silu_mul, GemvPlan(block_n, per_sm), pdl, None, scale)[0]


def add_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    block_n: int = 4,
    pdl: bool = False,
    per_sm: int = 0,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's residual add and RMSNorm in front of :func:`gemv`: ``h = x +
    residual``, then ``rmsnorm(h) * norm_weight`` goes through the product. Every program
    computes the norm of the one row itself, so the norm's own kernel disappears. Returns
    (the product, ``h``: the next residual)."""
    return _launch_gemv(
        x,
        weight,
        bias,
        silu_mul,
        GemvPlan(block_n, per_sm),
        pdl,
        (residual, norm_weight, eps),
        scale,
    )


def _launch_gemv(
    x, weight, bias, silu_mul: bool, plan: GemvPlan, pdl: bool, add_norm, scale=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    m, k = x.shape
    assert m == 1 and x.stride(1) == 1 and weight.shape[1] == k
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    residual, norm_weight, eps = add_norm if add_norm is not None else (x, x, 0.0)
    h = torch.empty_like(x) if add_norm is not None else None
    extra = {"launch_pdl": True} if pdl else {}
    common = (
        x,
        weight,
        bias if bias is not None else weight,
        y,
        residual,
        h if h is not None else x,
        norm_weight,
        scale if scale is not None else norm_weight,
        eps,
        n,
        weight.stride(0),
    )
    if plan.per_sm:
        assert weight.stride(1) == 1
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
        _gemv_rows_kernel[(min(triton.cdiv(n, plan.block_n), sms * plan.per_sm),)](
            *common,
            n,
            K=k,
            K_PAD=triton.next_power_of_2(k),
            HAS_BIAS=bias is not None,
            HAS_SCALE=scale is not None,
            SILU_MUL=silu_mul,
            NORM=add_norm is not None,
            BLOCK_N=plan.block_n,
            USE_PDL=pdl,
            num_warps=gemv_rows_warps(k, plan.block_n, silu_mul, weight.element_size()),
            **extra,
        )
        return y, h
    block_k = gemv_block_k(k, plan.block_n, weight.element_size())
    assert block_k is not None, f"no K tile divides {k}"
    _gemv_kernel[(triton.cdiv(n, plan.block_n),)](
        *common,
        weight.stride(1),
        n,
        K=k,
        HAS_BIAS=bias is not None,
        HAS_SCALE=scale is not None,
        SILU_MUL=silu_mul,
        NORM=add_norm is not None,
        BLOCK_N=plan.block_n,
        BLOCK_K=block_k,
        USE_PDL=pdl,
        num_warps=4,
        **extra,
    )
    return y, h


# Triton compiles a kernel once per "specialization" of its arguments (integers equal to 1 or
# divisible by 16, pointers aligned to 16 bytes). Arguments that vary with the batch (slices of
# the step's packed tensor, batch sizes) are not specialized, or a new batch shape would stall
# serving for a compilation: these two kernels compile once per model (and per heads_per_program).
@triton.jit(do_not_specialize_on_alignment=["positions_ptr", "out_loc_ptr"])
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    q_weight_ptr,
    k_weight_ptr,
    positions_ptr,
    out_loc_ptr,
    cos_sin_ptr,
    stride_qkv,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program: one token, ``HEADS_PER_PROGRAM`` consecutive heads of the merged projection
    (q heads, then k heads, then v heads), each head a row of the tile."""
    _pdl_wait(
        USE_PDL, PDL_TRIGGER
    )  # launched early (programmatic dependent): qkv is complete only from here on
    token = tl.program_id(0)
    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    is_q = heads < NUM_HEADS
    is_k = (heads >= NUM_HEADS) & (heads < NUM_HEADS + NUM_KV_HEADS)
    is_v = (heads >= NUM_HEADS + NUM_KV_HEADS) & (heads < NUM_HEADS + 2 * NUM_KV_HEADS)
    is_qk = (is_q | is_k)[:, None]
    half = tl.arange(0, HEAD_DIM // 2)
    src = qkv_ptr + token * stride_qkv + heads[:, None] * HEAD_DIM + half[None, :]
    exists = (is_q | is_k | is_v)[:, None]
    x1 = tl.load(src, mask=exists, other=0.0).to(tl.float32)
    x2 = tl.load(src + HEAD_DIM // 2, mask=exists, other=0.0).to(tl.float32)
    slot = tl.load(out_loc_ptr + token)
    kv_row = slot * (NUM_KV_HEADS * HEAD_DIM)
    if HAS_NORM:  # q heads take q's weight, k heads k's (v heads: neither)
        q_row = is_q[:, None]
        w1 = tl.where(
            q_row,
            tl.load(q_weight_ptr + half).to(tl.float32)[None, :],
            tl.load(k_weight_ptr + half).to(tl.float32)[None, :],
        )
        w2 = tl.where(
            q_row,
            tl.load(q_weight_ptr + HEAD_DIM // 2 + half).to(tl.float32)[None, :],
            tl.load(k_weight_ptr + HEAD_DIM // 2 + half).to(tl.float32)[None, :],
        )
        inv_rms = 1.0 / tl.sqrt(
            (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM + eps
        )
        x1 = tl.where(is_qk, x1 * inv_rms[:, None] * w1, x1)
        x2 = tl.where(is_qk, x2 * inv_rms[:, None] * w2, x2)
    # RoPE, rotate-half form: the table holds cos of each frequency, then its sin
    pos = tl.load(positions_ptr + token)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + half)[None, :]
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + HEAD_DIM // 2 + half)[None, :]
    out1 = tl.where(is_qk, x1 * cos - x2 * sin, x1)
    out2 = tl.where(is_qk, x2 * cos + x1 * sin, x2)
    # each head to its place: q to the output, k and v (straight, as loaded) into its slot
    q_dst = q_out_ptr + (token * NUM_HEADS + heads)[:, None] * HEAD_DIM + half[None, :]
    k_dst = k_cache_ptr + kv_row + (heads - NUM_HEADS)[:, None] * HEAD_DIM + half[None, :]
    v_dst = (
        v_cache_ptr
        + kv_row
        + (heads - NUM_HEADS - NUM_KV_HEADS)[:, None] * HEAD_DIM
        + half[None, :]
    )
    tl.store(q_dst, out1.to(q_out_ptr.dtype.element_ty), mask=is_q[:, None])
    tl.store(q_dst + HEAD_DIM // 2, out2.to(q_out_ptr.dtype.element_ty), mask=is_q[:, None])
    tl.store(k_dst, out1.to(k_cache_ptr.dtype.element_ty), mask=is_k[:, None])
    tl.store(k_dst + HEAD_DIM // 2, out2.to(k_cache_ptr.dtype.element_ty), mask=is_k[:, None])
    tl.store(v_dst, out1.to(v_cache_ptr.dtype.element_ty), mask=is_v[:, None])
    tl.store(v_dst + HEAD_DIM // 2, out2.to(v_cache_ptr.dtype.element_ty), mask=is_v[:, None])


def qk_heads_per_program(tokens: int, total_heads: int) -> int:
    """Heads of one token per program of :func:`qk_norm_rope_store`: one at a decode step of a
    few requests (every head its own program, spread over the SMs), more for larger batches
    (a program per head was 8,192 programs of 1 warp at batch 256: 10.5 us on an H200)."""
    per_program = 1 if tokens <= 8 else 4 if tokens <= 64 else 16
    return min(per_program, triton.next_power_of_2(total_heads))


def qk_norm_rope_store(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    out_loc: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pdl: bool = False,
) -> torch.Tensor:
    """From the merged projection ``qkv`` [tokens, (heads + 2 kv_heads) * head_dim]: normalise q
    and k per head (when the weights are given), rotate them, write K and V to the slots
    ``out_loc`` of this layer's ``k_cache``/``v_cache`` [slots, kv_heads, head_dim], and return
    q [tokens, heads, head_dim]. ``pdl``: launched as a programmatic dependent."""
    tokens = qkv.shape[0]
    assert qkv.stride(1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    has_norm = q_weight is not None
    total_heads = num_heads + 2 * num_kv_heads
    per_program = qk_heads_per_program(tokens, total_heads)
    _qk_norm_rope_store_kernel[(tokens, triton.cdiv(total_heads, per_program))](
        qkv,
        q,
        k_cache,
        v_cache,
        q_weight if has_norm else qkv,
        k_weight if has_norm else qkv,
        positions,
        out_loc,
        cos_sin_cache,
        qkv.stride(0),
        eps,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HAS_NORM=has_norm,
        HEADS_PER_PROGRAM=per_program,
        USE_PDL=pdl,
        num_warps=1 if per_program == 1 else 4,
        **({"launch_pdl": True} if pdl else {}),
    )
    return q


@triton.jit(
    do_not_specialize=["stride_table", "num_real", "padding_page"],
    do_not_specialize_on_alignment=["table_ptr", "rows_ptr", "indptr_ptr", "out_ptr"],
)
def _fill_kv_indices_kernel(
    table_ptr,
    rows_ptr,
    indptr_ptr,
    out_ptr,
    stride_table,
    num_real,
    padding_page,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)  # request
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # its pages, a block per program
    start = tl.load(indptr_ptr + i)
    count = tl.load(indptr_ptr + i + 1) - start
    if i >= num_real:  # a CUDA graph's padding row reads the padding page
        tl.store(out_ptr + start + j, tl.zeros_like(j) + padding_page, mask=j < count)
    else:
        row = tl.load(rows_ptr + i)
        slot = tl.load(table_ptr + row * stride_table + j * PAGE_SIZE, mask=j < count, other=0)
        tl.store(out_ptr + start + j, (slot // PAGE_SIZE).to(tl.int32), mask=j < count)


def fill_kv_indices(
    table: torch.Tensor,
    rows: torch.Tensor,
    indptr: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    padding_page: int,
    max_pages: int,
) -> torch.Tensor:
    """FlashInfer's page ids of every request, back to back: request ``i`` (page-table row
    ``rows[i]``) fills ``out[indptr[i]:indptr[i+1]]``; rows past ``len(rows)`` are padding rows
    (one page each). ``max_pages``: the most pages of any request. Returns ``out`` (int32)."""
    batch = indptr.numel() - 1
    block = 256  # fixed: one compiled kernel whatever the lengths
    _fill_kv_indices_kernel[(batch, triton.cdiv(max(1, max_pages), block))](
        table,
        rows,
        indptr,
        out,
        table.stride(0),
        rows.numel(),
        padding_page,
        PAGE_SIZE=page_size,
        BLOCK=block,
        num_warps=4,
    )
    return out


# ---- decode attention without a host-side plan ------------------------------------------------
# FlashInfer plans each decode step on the CPU (the split of every request's KV over the SMs,
# copied to the GPU) and needs the page list of the batch: at batch 1 that host work took longer
# than the GPU's whole step. These two kernels read each request's length from its position and
# its KV slots from the page table, inside the CUDA graph, so a step needs no plan at all.


@triton.jit(do_not_specialize=["stride_table"])
def _decode_attention_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    rows_ptr,
    positions_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_table,
    sm_scale,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program: one request, one KV head with every query head that reads it (as the 16
    rows of a tensor-core tile, the unused ones zero), one split of the request's tokens.
    Writes the split's softmax-weighted V and its log-sum-exp (base 2)."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(rows_ptr + b)
    seq_len = tl.load(positions_ptr + b) + 1  # decode: the newest token attends to all before it
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    g = tl.arange(0, 16)
    heads = kv_head * GROUP + g
    head_ok = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    _pdl_wait(USE_PDL, PDL_TRIGGER)  # q and this step's K/V come from the kernel before
    q = tl.load(
        q_ptr + (b * NUM_HEADS + heads)[:, None] * HEAD_DIM + dims[None, :],
        mask=head_ok[:, None],
        other=0.0,
    )
    qk_scale = sm_scale * 1.4426950408889634  # scores in log2 units: exp2 below
    m = tl.full((16,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((16,), dtype=tl.float32)
    acc = tl.zeros((16, HEAD_DIM), dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tokens = n0 + tl.arange(0, BLOCK_N)
        token_ok = tokens < end
        slots = tl.load(table_ptr + row * stride_table + tokens, mask=token_ok, other=0)
        kv = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        # widened to q's dtype where the pool is FP8 (--kv-dtype fp8; a no-op otherwise)
        k = tl.load(k_ptr + kv, mask=token_ok[:, None], other=0.0).to(q.dtype)
        v = tl.load(v_ptr + kv, mask=token_ok[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k)) * qk_scale  # [16, BLOCK_N]
        scores = tl.where(token_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    _pdl_done(USE_PDL, PDL_TRIGGER)
    if start < seq_len:  # a split past the end of a short request has no tokens: the merge skips it
        part = (b * NUM_HEADS + heads) * NUM_SPLITS + split
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
            acc / denom[:, None],
            mask=head_ok[:, None],
        )
        tl.store(part_lse_ptr + part, m + tl.log2(denom), mask=head_ok)


@triton.jit
def _decode_attention_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    positions_ptr,
    out_ptr,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program per (request, query head): the splits that hold tokens, each weighted by its
    share of the softmax's denominator."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(positions_ptr + b) + 1
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N  # as the split kernel cut it
    splits = tl.arange(0, SPLITS_P2)
    used = splits * chunk < seq_len
    dims = tl.arange(0, HEAD_DIM)
    part = (b * NUM_HEADS + head) * NUM_SPLITS + splits
    _pdl_wait(USE_PDL, PDL_TRIGGER)
    lse = tl.load(part_lse_ptr + part, mask=used, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 always holds tokens
    weight = weight / tl.sum(weight, axis=0)
    parts = tl.load(
        part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=used[:, None], other=0.0
    )
    out = tl.sum(weight[:, None] * parts, axis=0)
    tl.store(out_ptr + (b * NUM_HEADS + head) * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


DECODE_BLOCK_N = 64  # tokens per step of the fused kernel's loop (and its smallest piece)


class DecodeTiles(NamedTuple):
    """How the split kernel of :func:`decode_attention` walks the K/V: tokens per step of its
    loop (also the smallest piece), warps and pipeline stages per program, and how many
    programs per SM the pieces aim at. ``MINISGL_DECODE_TILES=block_n,warps,stages,programs``
    overrides them, for measuring (``scripts/gpu_decode_sweep.py``)."""

    # kept after a sweep (scripts/gpu_decode_sweep.py, H200): (32, 2, 2, 8) was up to 10% faster
    # alone (batches 16-256) and at batch 1 (6.66 against 7.88 us a layer at 1,024 tokens), yet
    # inside the engine batch-1 decode and the offline workload were no faster (docs/benchmarks.md)
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4


DECODE_TILES = DecodeTiles(
    *env_ints("MINISGL_DECODE_TILES", DecodeTiles._fields, tuple(DecodeTiles()))
)


def decode_attention_splits(
    batch_size: int, num_kv_heads: int, num_sms: int, programs_per_sm: int | None = None
) -> int:
    """How many pieces each request's tokens are cut into: about ``programs_per_sm`` programs per
    SM (at batch 1 a request has only ``num_kv_heads`` programs otherwise), at most 64. A piece
    is at least one block of tokens, so a short request leaves most pieces empty (they end at once)."""
    per_sm = DECODE_TILES.programs_per_sm if programs_per_sm is None else programs_per_sm
    return max(1, min(64, per_sm * num_sms // max(1, batch_size * num_kv_heads)))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    num_splits: int,
    pdl: bool = False,
    tiles: DecodeTiles | None = None,
) -> torch.Tensor:
    """Attention of one new token per request over its whole context: request ``i`` is the
    page-table row ``rows[i]`` with its newest token at ``positions[i]`` (its K/V already in the
    pool), so it reads slots ``table[rows[i], :positions[i] + 1]`` of ``k_cache``/``v_cache``
    [slots, kv_heads, head_dim]. q: [batch, heads, head_dim]; returns [batch, heads * head_dim].
    Each request's tokens are cut into ``num_splits`` pieces computed in parallel, then merged
    (``tiles``: the split kernel's, :data:`DECODE_TILES` if None)."""
    tiles = tiles or DECODE_TILES
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    assert (
        q.is_contiguous()
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and table.stride(1) == 1
    )
    assert num_heads % num_kv_heads == 0 and group <= 16 and head_dim & (head_dim - 1) == 0
    out = torch.empty(batch, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    part_out = torch.empty(
        batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    extra = {"launch_pdl": True} if pdl else {}
    _decode_attention_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        table,
        rows,
        positions,
        part_out,
        part_lse,
        table.stride(0),
        scale,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_N=tiles.block_n,
        USE_PDL=pdl,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        **extra,
    )
    _decode_attention_merge_kernel[(batch, num_heads)](
        part_out,
        part_lse,
        positions,
        out,
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        SPLITS_P2=triton.next_power_of_2(num_splits),
        BLOCK_N=tiles.block_n,
        USE_PDL=pdl,
        num_warps=1 if num_splits <= 16 else 4,
        **extra,
    )
    return out


# ---- decode attention straight from the merged projection -------------------------------------
# The chain above is three kernels after the qkv product (q/k kernel, split, merge), each waiting
# for the one before: inside Qwen3-8B's batch-1 step ~15 us per layer at 128 tokens of context.
# This kernel does all three: every program normalises and rotates its own query heads from
# ``qkv``; the program whose piece holds the newest token takes that token's K/V from ``qkv``
# (and writes them to the pool for later steps); the last piece of a (request, KV head) to finish
# merges the pieces, counted by an atomic counter (no merge kernel). Measured faster for the 8B,
# slower for the 0.6B (docs/benchmarks.md, seventh round): opt-in, MINISGL_DECODE_ATTENTION=fused.

DECODE_MIN_CHUNK = (
    64  # the fewest tokens a piece of decode_attention_qkv holds (as the split kernel's)
)
# requests of up to this many tokens attend in one piece, without a merge (MINISGL_FUSED_SINGLE, for measuring)
DECODE_SINGLE_MAX = int(os.environ.get("MINISGL_FUSED_SINGLE", "0"))


@triton.jit
def _rope_rows(
    x_ptr, rows, dims, w_ptr, cos_sin_ptr, pos, eps, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr
):
    """Heads ``rows`` (offsets of their first elements) of ``x``, each normalised (with
    ``HAS_NORM``) and rotated (rotate-half RoPE at ``pos``), as whole rows: element d pairs with
    d +- HEAD_DIM / 2, loaded a second time, so the tile feeds one tensor-core product."""
    half = HEAD_DIM // 2
    partner = (dims + half) % HEAD_DIM
    x = tl.load(x_ptr + rows + dims[None, :]).to(tl.float32)
    x_partner = tl.load(x_ptr + rows + partner[None, :]).to(tl.float32)
    if HAS_NORM:
        inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
        x = x * inv_rms[:, None] * tl.load(w_ptr + dims).to(tl.float32)[None, :]
        x_partner = x_partner * inv_rms[:, None] * tl.load(w_ptr + partner).to(tl.float32)[None, :]
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + dims % half)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + half + dims % half)
    return x * cos[None, :] + tl.where(dims < half, -1.0, 1.0)[None, :] * x_partner * sin[None, :]


@triton.jit(
    do_not_specialize=["stride_table"],
    do_not_specialize_on_alignment=["positions_ptr", "out_loc_ptr"],
)
def _decode_attention_qkv_kernel(
    qkv_ptr,
    k_ptr,
    v_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_sin_ptr,
    positions_ptr,
    out_loc_ptr,
    table_ptr,
    rows_ptr,
    part_out_ptr,
    part_lse_ptr,
    counters_ptr,
    out_ptr,
    stride_qkv,
    stride_table,
    eps,
    sm_scale,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    SINGLE_MAX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program: one request, one KV head with its query heads (rows of a 16-row tile), one
    piece of the request's tokens, as in :func:`_decode_attention_split_kernel`; the newest
    token's K/V come from ``qkv`` (and go to the pool), not from the pool."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    pos = tl.load(positions_ptr + b)
    seq_len = pos + 1
    chunk = tl.maximum(MIN_CHUNK, tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N)
    if seq_len <= SINGLE_MAX:  # a short request in one piece: no merge on the critical path
        chunk = tl.cdiv(seq_len, BLOCK_N) * BLOCK_N
    start = split * chunk
    if (
        start < seq_len
    ):  # a piece past the end of a short request ends at once (at batch 1 most of them)
        end = tl.minimum(start + chunk, seq_len)
        cached_end = tl.minimum(end, pos)  # the newest token (at pos) is not in the pool yet
        used = tl.cdiv(seq_len, chunk)  # pieces that hold tokens
        row = tl.load(rows_ptr + b)
        dims = tl.arange(0, HEAD_DIM)
        g = tl.arange(0, 16)
        heads = kv_head * GROUP + g
        head_ok = g < GROUP
        _pdl_wait(USE_PDL, PDL_TRIGGER)  # qkv comes from the kernel before
        qkv_row = qkv_ptr + b * stride_qkv
        # q rounded to the model's dtype, as the q/k kernel hands it to attention
        q = _rope_rows(
            qkv_row,
            tl.where(head_ok, heads, 0)[:, None] * HEAD_DIM,
            dims,
            q_weight_ptr,
            cos_sin_ptr,
            pos,
            eps,
            HEAD_DIM,
            HAS_NORM,
        ).to(qkv_ptr.dtype.element_ty)
        qk_scale = sm_scale * 1.4426950408889634  # scores in log2 units: exp2 below
        m = tl.full((16,), float("-inf"), dtype=tl.float32)
        denom = tl.zeros((16,), dtype=tl.float32)
        acc = tl.zeros((16, HEAD_DIM), dtype=tl.float32)
        for n0 in range(start, cached_end, BLOCK_N):
            tokens = n0 + tl.arange(0, BLOCK_N)
            token_ok = tokens < cached_end
            slots = tl.load(table_ptr + row * stride_table + tokens, mask=token_ok, other=0)
            kv = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
            k = tl.load(k_ptr + kv, mask=token_ok[:, None], other=0.0).to(
                q.dtype
            )  # widened from FP8 (--kv-dtype fp8)
            v = tl.load(v_ptr + kv, mask=token_ok[:, None], other=0.0).to(q.dtype)
            scores = tl.dot(q, tl.trans(k)) * qk_scale  # [16, BLOCK_N]
            scores = tl.where(token_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            denom = denom * alpha + tl.sum(p, axis=1)
            m = m_new
        _pdl_done(USE_PDL, PDL_TRIGGER)
        if (
            end == seq_len
        ):  # this piece holds the newest token: its K (normalised, rotated) and V from qkv
            new_k = _rope_rows(
                qkv_row,
                tl.zeros((1, 1), tl.int32) + (NUM_HEADS + kv_head) * HEAD_DIM,
                dims,
                k_weight_ptr,
                cos_sin_ptr,
                pos,
                eps,
                HEAD_DIM,
                HAS_NORM,
            ).to(k_ptr.dtype.element_ty)  # [1, HEAD_DIM]
            # rounded as the pool holds it (FP8 with --kv-dtype fp8), as later steps will read it
            new_v = tl.load(qkv_row + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM + dims).to(
                v_ptr.dtype.element_ty
            )
            slot_row = tl.load(out_loc_ptr + b) * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM
            tl.store(
                k_ptr + slot_row + dims[None, :], new_k
            )  # into the pool for the steps after this one
            tl.store(v_ptr + slot_row + dims, new_v)
            score = tl.sum(q.to(tl.float32) * new_k.to(tl.float32), axis=1) * qk_scale
            m_new = tl.maximum(m, score)
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(score - m_new)
            acc = acc * alpha[:, None] + p[:, None] * new_v.to(tl.float32)[None, :]
            denom = denom * alpha + p
            m = m_new
        if used == 1:  # the whole request in one piece: nothing to merge
            out_rows = out_ptr + (b * NUM_HEADS + heads)[:, None] * HEAD_DIM + dims[None, :]
            tl.store(
                out_rows, (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=head_ok[:, None]
            )
        else:
            part = (b * NUM_HEADS + heads) * NUM_SPLITS + split
            tl.store(
                part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                acc / denom[:, None],
                mask=head_ok[:, None],
            )
            tl.store(part_lse_ptr + part, m + tl.log2(denom), mask=head_ok)
            tl.debug_barrier()  # every thread's part is written before the count says so
            counter = counters_ptr + b * NUM_KV_HEADS + kv_head
            if (
                tl.atomic_add(counter, 1, sem="acq_rel") == used - 1
            ):  # the last piece: merge them all, a head at a time
                pieces = tl.arange(0, SPLITS_P2)
                piece_ok = pieces < used
                for h in tl.static_range(GROUP):
                    first = (b * NUM_HEADS + kv_head * GROUP + h) * NUM_SPLITS
                    lse = tl.load(
                        part_lse_ptr + first + pieces,
                        mask=piece_ok,
                        other=float("-inf"),
                        cache_modifier=".cg",
                    )
                    weight = tl.exp2(lse - tl.max(lse, axis=0))
                    weight = weight / tl.sum(weight, axis=0)
                    parts = tl.load(
                        part_out_ptr + (first + pieces)[:, None] * HEAD_DIM + dims[None, :],
                        mask=piece_ok[:, None],
                        other=0.0,
                        cache_modifier=".cg",
                    )
                    merged = tl.sum(weight[:, None] * parts, axis=0)
                    tl.store(
                        out_ptr + (b * NUM_HEADS + kv_head * GROUP + h) * HEAD_DIM + dims,
                        merged.to(out_ptr.dtype.element_ty),
                    )
                tl.atomic_xchg(counter, 0)  # ready for the next layer


def decode_attention_qkv(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos_sin_cache: torch.Tensor,
    out_loc: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    num_splits: int,
    counters: torch.Tensor,
    pdl: bool = False,
    min_chunk: int = DECODE_MIN_CHUNK,
    single_max: int = -1,
) -> torch.Tensor:
    """:func:`qk_norm_rope_store` then :func:`decode_attention` in one kernel, for a decode
    step (one new token per request, at ``positions``): from the merged projection ``qkv``
    [batch, (heads + 2 kv_heads) * head_dim], writes each request's new K/V to its slot
    ``out_loc`` and returns the attention output [batch, heads * head_dim]. A request's tokens
    are cut into at most ``num_splits`` pieces of at least ``min_chunk`` tokens; a request of at most
    ``single_max`` tokens (-1: :data:`DECODE_SINGLE_MAX`) is one piece. ``counters``:
    int32 zeros, at least batch * kv_heads of them, left at zero again (a buffer a CUDA graph
    keeps)."""
    batch = qkv.shape[0]
    group = num_heads // num_kv_heads
    assert (
        qkv.stride(1) == 1
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and table.stride(1) == 1
    )
    assert num_heads % num_kv_heads == 0 and group <= 16 and head_dim & (head_dim - 1) == 0
    assert (
        counters.dtype == torch.int32
        and counters.numel() >= batch * num_kv_heads
        and min_chunk % DECODE_BLOCK_N == 0
    )
    out = torch.empty(batch, num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    if batch == 0:
        return out
    part_out = torch.empty(
        batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=qkv.device
    )
    part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=qkv.device)
    has_norm = q_weight is not None
    single_max = DECODE_SINGLE_MAX if single_max < 0 else single_max
    _decode_attention_qkv_kernel[(batch, num_kv_heads, num_splits)](
        qkv,
        k_cache,
        v_cache,
        q_weight if has_norm else qkv,
        k_weight if has_norm else qkv,
        cos_sin_cache,
        positions,
        out_loc,
        table,
        rows,
        part_out,
        part_lse,
        counters,
        out,
        qkv.stride(0),
        table.stride(0),
        eps,
        scale,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        HAS_NORM=has_norm,
        NUM_SPLITS=num_splits,
        SPLITS_P2=triton.next_power_of_2(num_splits),
        MIN_CHUNK=min_chunk,
        SINGLE_MAX=single_max,
        BLOCK_N=DECODE_BLOCK_N,
        USE_PDL=pdl,
        num_warps=4,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


# ---- sampling ------------------------------------------------------------------------------------

SAMPLE_CHUNK = 4096  # vocabulary entries per program: a 152k vocabulary is 38 programs per row


@triton.jit
def _gumbel_max_quarter(logits_ptr, start, lanes, vocab, inv_t, u):
    """The best of tokens ``start + lanes`` (one quarter of a chunk) by logit / T plus Gumbel
    noise from the uniform draws ``u`` (u = 0 gives -inf, never the maximum), and its token."""
    cols = start + lanes
    ok = cols < vocab
    logits = tl.load(logits_ptr + cols, mask=ok, other=float("-inf"))
    keys = tl.where(ok, logits * inv_t - tl.log(-tl.log(u)), float("-inf"))
    best, where = tl.max(keys, axis=0, return_indices=True)
    return best, start + where


@triton.jit(do_not_specialize=["seed", "vocab", "stride_row"])
def _gumbel_max_kernel(
    logits_ptr, temps_ptr, best_ptr, where_ptr, seed, vocab, stride_row, CHUNK: tl.constexpr
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    QUARTER: tl.constexpr = CHUNK // 4
    lanes = tl.arange(0, QUARTER)
    first = chunk * CHUNK
    # one Philox evaluation gives four draws, one for each quarter of the chunk: the noise, not
    # the logits' bytes, was this kernel's cost with a Philox evaluation per token
    u0, u1, u2, u3 = tl.rand4x(seed, row * vocab + chunk * QUARTER + lanes)
    inv_t = 1.0 / tl.load(temps_ptr + row)
    row_ptr = logits_ptr + row * stride_row
    best, where = _gumbel_max_quarter(row_ptr, first, lanes, vocab, inv_t, u0)
    b, w = _gumbel_max_quarter(row_ptr, first + QUARTER, lanes, vocab, inv_t, u1)
    best, where = tl.where(b > best, b, best), tl.where(b > best, w, where)
    b, w = _gumbel_max_quarter(row_ptr, first + 2 * QUARTER, lanes, vocab, inv_t, u2)
    best, where = tl.where(b > best, b, best), tl.where(b > best, w, where)
    b, w = _gumbel_max_quarter(row_ptr, first + 3 * QUARTER, lanes, vocab, inv_t, u3)
    best, where = tl.where(b > best, b, best), tl.where(b > best, w, where)
    tl.store(best_ptr + row * tl.num_programs(1) + chunk, best)
    tl.store(where_ptr + row * tl.num_programs(1) + chunk, where)


def gumbel_sample(logits: torch.Tensor, temperatures: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per row of float32 ``logits`` [rows, vocab], drawn from softmax(logits / T)
    with that row's temperature (``temperatures``: float32 [rows]) by the Gumbel-max trick:
    argmax(logits / T + G), G independent Gumbel noise from Philox(``seed``), one Philox
    evaluation for four tokens. One read of the logits; the division by the temperature and a
    softmax pass are never written out (in the offline workload, dividing and then sampling
    took 230 µs of a 6.3 ms step at batch 256; one Philox evaluation per token, 227 µs).
    Returns int64 token ids [rows]."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and logits.dtype == torch.float32
    chunks = triton.cdiv(vocab, SAMPLE_CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    where = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    _gumbel_max_kernel[(rows, chunks)](
        logits,
        temperatures,
        best,
        where,
        seed,
        vocab,
        logits.stride(0),
        CHUNK=SAMPLE_CHUNK,
        num_warps=8,
    )
    return where.gather(1, best.argmax(dim=1, keepdim=True)).squeeze(1).long()


@triton.jit
def _quantize_rows_fp8_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_x, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr
):
    """One row: its largest magnitude sets its scale; the row divided by it, in FP8."""
    row = tl.program_id(0)
    ks = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + ks, mask=ks < K, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    # divisions rounded as torch's (IEEE), so both give the same FP8 codes
    scale = tl.where(amax > 0, tl.math.div_rn(amax, FP8_MAX), 1.0)
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * K + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    tl.store(s_ptr + row, scale)


def quantize_rows_fp8(x: torch.Tensor, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in FP8 [rows, k], float32 scale per row [rows, 1]) in one pass over ``x``: what the
    FP8 tensor-core product takes as its input (layers/fp8.py); torch's five operations for it
    cost more than the product itself at a few rows."""
    rows, k = x.shape
    assert x.stride(1) == 1
    q = torch.empty(rows, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    _quantize_rows_fp8_kernel[(rows,)](
        x,
        q,
        scale,
        k,
        x.stride(0),
        FP8_MAX=fp8_max,
        BLOCK=block,
        num_warps=min(16, max(4, block // 1024)),
    )
    return q, scale
