"""The fused Triton kernels (engine/kernels/triton_kernels.py) against plain torch.

Without a GPU they run under Triton's interpreter (numpy on the CPU, float16/float32: numpy has
no bfloat16); on a GPU they run compiled, in bfloat16. Either way every output element is
compared with a float32 reference computed the way our torch path computes it.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before the kernels are defined

pytest.importorskip("triton")

from minisgl_engine.kernels import triton_kernels as tk  # noqa: E402
from minisgl_engine.layers.rotary import RotaryEmbedding  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
# one rounding of the result to the model's dtype, after float32 arithmetic
RTOL = 2**-7 if DTYPE == torch.bfloat16 else 2**-10
FP8 = torch.float8_e4m3fn  # the KV pool's dtype with --kv-dtype fp8
# Triton's CPU interpreter rounds float32 to FP8 without the carry into the exponent (1.96 -> 1.0,
# where the GPU and torch give 2.0): kernels that store FP8 are checked on the GPU only
STORES_FP8 = pytest.mark.skipif(
    not ON_GPU, reason="Triton's interpreter rounds to FP8 wrongly; checked on the GPU"
)


def close(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> None:
    scale = scale if scale is not None else expected.abs().max().item()
    err = (actual.float() - expected.float()).abs().max().item()
    assert err <= 2 * RTOL * scale + 1e-6, f"max error {err} (scale {scale})"


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(64, 128), (48, 96), (40, 256)])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_matmul_matches_a_float32_product(rows, n, k, bias) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen).to(DTYPE).to(DEVICE)
    w = torch.randn(n, k, generator=gen).to(DTYPE).to(DEVICE) / k**0.5
    b = torch.randn(n, generator=gen).to(DTYPE).to(DEVICE) if bias else None
    expected = x.float() @ w.float().T + (b.float() if bias else 0)
    out = tk.skinny_matmul(x, w, b)
    assert out.shape == (rows, n) and out.dtype == DTYPE
    close(out, expected)


@pytest.mark.parametrize("rows", [1, 5])
def test_skinny_matmul_fuses_silu_and_mul(rows) -> None:
    gen = torch.Generator().manual_seed(rows)
    inter, k = 48, 64
    x = torch.randn(rows, k, generator=gen).to(DTYPE).to(DEVICE)
    w = torch.randn(2 * inter, k, generator=gen).to(DTYPE).to(DEVICE) / k**0.5
    gate_up = x.float() @ w.float().T
    expected = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    out = tk.skinny_matmul(x, w, silu_mul=True)
    assert out.shape == (rows, inter)
    close(out, expected)


def test_skinny_matmul_reads_a_strided_input() -> None:
    """The kernel takes rows with a stride (a slice of a wider activation)."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 256, generator=gen).to(DTYPE).to(DEVICE)
    x = wide[:, :128]
    w = torch.randn(32, 128, generator=gen).to(DTYPE).to(DEVICE) / 128**0.5
    close(tk.skinny_matmul(x, w), x.float() @ w.float().T)


@pytest.mark.parametrize("rows", [16, 40])
@pytest.mark.parametrize("silu_mul", [False, True])
def test_matmul_covers_many_row_tiles(rows, silu_mul) -> None:
    """Larger batches: output tiles of 16 rows and 32 columns over a grid, the last of each
    partly masked (40 rows, 48 columns), a K step of 32 over a reduction of 96."""
    gen = torch.Generator().manual_seed(rows + silu_mul)
    n, k = 48, 96
    x = torch.randn(rows, k, generator=gen).to(DTYPE).to(DEVICE)
    w = torch.randn(2 * n if silu_mul else n, k, generator=gen).to(DTYPE).to(DEVICE) / k**0.5
    b = None if silu_mul else torch.randn(n, generator=gen).to(DTYPE).to(DEVICE)
    product = x.float() @ w.float().T
    expected = (
        torch.nn.functional.silu(product[:, :n]) * product[:, n:]
        if silu_mul
        else product + b.float()
    )
    out = tk.matmul(
        x,
        w,
        b,
        silu_mul=silu_mul,
        tiles=tk.MatmulTiles(block_m=16, block_n=32, block_k=32, warps=4, stages=2),
    )
    assert out.shape == (rows, n) and out.dtype == DTYPE
    close(out, expected)


@pytest.mark.parametrize("block_n,per_sm", [(4, 0), (8, 0), (1, 4), (2, 1)])
@pytest.mark.parametrize(
    "n,k,bias,silu_mul", [(64, 128, False, False), (45, 96, True, False), (40, 256, False, True)]
)
def test_gemv_matches_a_float32_product(block_n, per_sm, n, k, bias, silu_mul) -> None:
    """One row (batch-1 decode): k 96 runs the K loop over three tiles of 32 (the largest power
    of two dividing it; the row-walking plans pad it to 128), 45 outputs are not a multiple of
    the block, SwiGLU fused. The row-walking plans (per_sm > 0) run far fewer programs than
    row blocks (on the CPU 2 SMs are assumed), so each program walks many rows."""
    gen = torch.Generator().manual_seed(block_n * 1000 + n + k)
    x = torch.randn(1, k, generator=gen).to(DTYPE).to(DEVICE)
    w = torch.randn(2 * n if silu_mul else n, k, generator=gen).to(DTYPE).to(DEVICE) / k**0.5
    b = torch.randn(n, generator=gen).to(DTYPE).to(DEVICE) if bias else None
    expected = x.float() @ w.float().T + (b.float() if bias else 0)
    if silu_mul:
        expected = torch.nn.functional.silu(expected[:, :n]) * expected[:, n:]
    out = tk.gemv(
        x, w, b, silu_mul=silu_mul, block_n=block_n, pdl=tk.pdl_supported(DEVICE), per_sm=per_sm
    )
    assert out.shape == (1, n) and out.dtype == DTYPE
    close(out, expected)


@pytest.mark.parametrize("per_sm", [0, 2])
@pytest.mark.parametrize("silu_mul,bias", [(False, True), (True, False)])
def test_add_norm_gemv_is_the_residual_add_and_rmsnorm_then_the_product(
    silu_mul, bias, per_sm
) -> None:
    """h = x + residual (the next residual, rounded once), then rmsnorm(h) * g through the
    product; k 96 is three K tiles, so the norm's sum of squares spans the loop (per_sm 0), or
    one padded row of 128 held by each program (per_sm 2)."""
    gen = torch.Generator().manual_seed(7 + silu_mul)
    n, k, eps = 24, 96, 1e-6
    x = torch.randn(1, k, generator=gen).to(DTYPE).to(DEVICE)
    residual = (3 * torch.randn(1, k, generator=gen)).to(DTYPE).to(DEVICE)
    g = (1 + 0.2 * torch.randn(k, generator=gen)).to(DTYPE).to(DEVICE)
    w = torch.randn(2 * n if silu_mul else n, k, generator=gen).to(DTYPE).to(DEVICE) / k**0.5
    b = torch.randn(n, generator=gen).to(DTYPE).to(DEVICE) if bias else None
    h = (x.float() + residual.float()).to(DTYPE)
    normed = h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + eps) * g.float()
    expected = normed @ w.float().T + (b.float() if bias else 0)
    if silu_mul:
        expected = torch.nn.functional.silu(expected[:, :n]) * expected[:, n:]
    out, new_residual = tk.add_norm_gemv(
        x,
        residual,
        g,
        eps,
        w,
        b,
        silu_mul=silu_mul,
        block_n=8 if not per_sm else 2,
        pdl=tk.pdl_supported(DEVICE),
        per_sm=per_sm,
    )
    assert torch.equal(new_residual, h) and out.shape == (1, n)
    close(out, expected)


@pytest.mark.parametrize("block_n,per_sm", [(4, 0), (1, 4)])
@pytest.mark.parametrize(
    "silu_mul,bias,norm", [(False, True, False), (True, False, False), (True, False, True)]
)
def test_gemv_of_fp8_weights_is_the_product_of_the_widened_weights(
    block_n, per_sm, silu_mul, bias, norm
) -> None:
    """--quantization fp8 at one row: the kernel reads 8-bit weights and their per-row scales
    (gate and up rows scaled apart with SwiGLU; with the norm inside too) and gives the product
    of the widened weights, up to the one rounding of the result."""
    from minisgl_engine.layers.fp8 import dequantize_fp8, quantize_fp8

    gen = torch.Generator().manual_seed(11 + 2 * silu_mul + norm)
    n, k, eps = 40, 256, 1e-6
    rows = 2 * n if silu_mul else n
    # rows of very different magnitudes: each needs its own scale
    w16 = (torch.randn(rows, k, generator=gen) * torch.logspace(-2, 1, rows)[:, None] / k**0.5).to(
        DTYPE
    )
    weight, scale = quantize_fp8(w16.to(DEVICE))
    wide = dequantize_fp8(weight, scale, torch.float32)
    x = torch.randn(1, k, generator=gen).to(DTYPE).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DTYPE).to(DEVICE) if bias else None
    inputs = x.float()
    if norm:
        residual = torch.randn(1, k, generator=gen).to(DTYPE).to(DEVICE)
        g = (1 + 0.2 * torch.randn(k, generator=gen)).to(DTYPE).to(DEVICE)
        h = (x.float() + residual.float()).to(DTYPE).float()
        inputs = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * g.float()
    expected = inputs @ wide.T + (b.float() if bias else 0)
    if silu_mul:
        expected = torch.nn.functional.silu(expected[:, :n]) * expected[:, n:]
    plan = dict(block_n=block_n, per_sm=per_sm, pdl=tk.pdl_supported(DEVICE), scale=scale)
    if norm:
        out, _ = tk.add_norm_gemv(x, residual, g, eps, weight, b, silu_mul=silu_mul, **plan)
    else:
        out = tk.gemv(x, weight, b, silu_mul=silu_mul, **plan)
    assert out.shape == (1, n) and out.dtype == DTYPE
    close(out, expected)


@STORES_FP8
@pytest.mark.parametrize("rows,k", [(1, 4096), (5, 12288), (33, 96)])
def test_rows_quantized_to_fp8_in_one_kernel_are_torchs_rounding(rows, k) -> None:
    """The FP8 product's input: each row scaled by its largest magnitude (a zero row by 1),
    then rounded to FP8, as torch's operations do it."""
    from minisgl_engine.layers.fp8 import FP8_MAX

    gen = torch.Generator().manual_seed(rows + k)
    x = (torch.randn(rows, k, generator=gen) * torch.logspace(-3, 2, rows)[:, None]).to(DTYPE)
    x[0, :] = 0
    x = x.to(DEVICE)
    q, scale = tk.quantize_rows_fp8(x, FP8_MAX)
    amax = x.float().abs().amax(dim=1, keepdim=True)
    want_scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    want = (x.float() / want_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    assert q.dtype == FP8 and scale.shape == (rows, 1)
    assert torch.allclose(scale, want_scale, rtol=1e-6)
    assert torch.equal(q.float(), want.float())


def test_gemv_tiles_k_within_the_register_budget() -> None:
    assert (
        tk.gemv_block_k(3072, 4) == 1024
        and tk.gemv_block_k(2048, 4) == 2048
        and tk.gemv_block_k(2048, 8) == 1024
    )
    assert tk.gemv_block_k(96, 4) == 32 and tk.gemv_block_k(24, 4) is None


def reference_qk(qkv, heads, kv_heads, dim, q_w, k_w, eps, positions, rotary):
    """Our torch path in float32: per-head RMSNorm, then rotate-half RoPE."""
    x = qkv.float().view(qkv.shape[0], heads + 2 * kv_heads, dim)
    q, k, v = x[:, :heads], x[:, heads : heads + kv_heads], x[:, heads + kv_heads :]
    if q_w is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_w.float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_w.float()
    table = rotary.cos_sin_cache.cpu()[positions.cpu()]
    cos, sin = table[:, None, : dim // 2], table[:, None, dim // 2 :]

    def rotate(t):
        t1, t2 = t[..., : dim // 2].cpu(), t[..., dim // 2 :].cpu()
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)

    return rotate(q), rotate(k), v.cpu()


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (2, 2), (6, 2)])
@pytest.mark.parametrize(
    "tokens", [5, 40, 70]
)  # 1, 4 and 16 heads per program (tk.qk_heads_per_program)
def test_qk_norm_rope_store_writes_q_and_the_kv_slots(qk_norm, heads, kv_heads, tokens) -> None:
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads + qk_norm + tokens)
    dim, slots, eps = 32, tokens + 11, 1e-6
    rotary = RotaryEmbedding(dim, 64, 10000.0, None, torch.float32).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(DTYPE).to(DEVICE)
    q_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DTYPE).to(DEVICE) if qk_norm else None
    k_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DTYPE).to(DEVICE) if qk_norm else None
    positions = torch.tensor(
        [0, 7, 3, 63, 12] + [random.Random(tokens).randrange(64) for _ in range(tokens - 5)],
        device=DEVICE,
    )
    out_loc = torch.tensor(random.Random(1).sample(range(slots), tokens), device=DEVICE)
    k_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=DTYPE, device=DEVICE)
    v_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=DTYPE, device=DEVICE)
    q = tk.qk_norm_rope_store(
        qkv,
        heads,
        kv_heads,
        dim,
        q_w,
        k_w,
        eps,
        positions,
        rotary.cos_sin_cache,
        out_loc,
        k_cache,
        v_cache,
    )
    ref_q, ref_k, ref_v = reference_qk(qkv, heads, kv_heads, dim, q_w, k_w, eps, positions, rotary)
    close(q.cpu(), ref_q)
    close(k_cache[out_loc].cpu(), ref_k)
    assert torch.equal(v_cache[out_loc].cpu().float(), ref_v)  # copied exactly
    untouched = sorted(set(range(slots)) - set(out_loc.tolist()))
    assert bool((k_cache[untouched] == 9).all()) and bool((v_cache[untouched] == 9).all())


@STORES_FP8
@pytest.mark.parametrize("tokens", [5, 70])
def test_qk_norm_rope_store_rounds_k_and_v_once_into_an_fp8_pool(tokens) -> None:
    """--kv-dtype fp8: q stays in the model's dtype; K (from float32) and V are rounded to e4m3."""
    gen = torch.Generator().manual_seed(tokens)
    heads, kv_heads, dim, slots, eps = 4, 2, 32, tokens + 11, 1e-6
    rotary = RotaryEmbedding(dim, 64, 10000.0, None, torch.float32).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(DTYPE).to(DEVICE)
    q_w, k_w = [(1 + 0.1 * torch.randn(dim, generator=gen)).to(DTYPE).to(DEVICE) for _ in range(2)]
    positions = torch.tensor(
        [random.Random(tokens + i).randrange(64) for i in range(tokens)], device=DEVICE
    )
    out_loc = torch.tensor(random.Random(2).sample(range(slots), tokens), device=DEVICE)
    k_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=FP8, device=DEVICE)
    v_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=FP8, device=DEVICE)
    q = tk.qk_norm_rope_store(
        qkv,
        heads,
        kv_heads,
        dim,
        q_w,
        k_w,
        eps,
        positions,
        rotary.cos_sin_cache,
        out_loc,
        k_cache,
        v_cache,
    )
    ref_q, ref_k, ref_v = reference_qk(qkv, heads, kv_heads, dim, q_w, k_w, eps, positions, rotary)
    assert q.dtype == DTYPE
    close(q.cpu(), ref_q)
    assert torch.allclose(k_cache[out_loc].cpu().float(), ref_k.float(), rtol=2**-3, atol=2**-9)
    assert not torch.equal(
        k_cache[out_loc].cpu().float(), ref_k.float()
    )  # rounded, not widened back to bf16
    assert torch.equal(v_cache[out_loc].cpu().float(), ref_v.to(FP8).float())
    untouched = sorted(set(range(slots)) - set(out_loc.tolist()))
    assert bool((k_cache[untouched].float() == 9).all()) and bool(
        (v_cache[untouched].float() == 9).all()
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_fill_kv_indices_lists_each_requests_pages_then_padding(page_size) -> None:
    rng = random.Random(page_size)
    max_len, num_rows = 40, 6
    table = torch.zeros(num_rows, max_len + page_size - 1, dtype=torch.int64)
    pages_of = {}
    free = list(range(1000))
    rng.shuffle(free)
    for row in range(num_rows):
        pages = [free.pop() for _ in range(-(-max_len // page_size))]
        pages_of[row] = pages
        for pos in range(max_len + page_size - 1):
            table[row, pos] = (
                pages[pos // page_size] * page_size + pos % page_size
                if pos // page_size < len(pages)
                else 0
            )
    rows = [4, 1, 2]
    seq_lens = [1, 17, 40]
    counts = [-(-n // page_size) for n in seq_lens] + [1, 1]  # two padding rows
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    out = torch.full((indptr[-1] + 3,), -5, dtype=torch.int32, device=DEVICE)
    tk.fill_kv_indices(
        table.to(DEVICE),
        torch.tensor(rows, device=DEVICE),
        torch.tensor(indptr, dtype=torch.int32, device=DEVICE),
        out,
        page_size,
        padding_page=1000,
        max_pages=max(counts),
    )
    expected = [p for row, c in zip(rows, counts) for p in pages_of[row][:c]] + [1000, 1000]
    assert out[: indptr[-1]].tolist() == expected
    assert out[indptr[-1] :].tolist() == [-5] * 3  # nothing written past the batch


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,num_splits,kv_dtype",
    [
        (4, 2, 32, 1, DTYPE),
        (6, 2, 64, 3, DTYPE),
        (2, 2, 32, 8, DTYPE),
        (4, 2, 32, 3, DTYPE),
        (6, 2, 64, 3, FP8),
        (4, 2, 32, 8, FP8),
    ],
)
def test_decode_attention_reads_each_requests_slots_from_the_page_table(
    heads, kv_heads, head_dim, num_splits, kv_dtype
) -> None:
    """One new token per request against a float32 softmax over exactly the slots its table
    row lists up to its position: lengths from 1 (a padding row) to several blocks, splits that
    get no tokens, a group of 3 query heads per KV head (not a power of two); a pool in FP8
    (--kv-dtype fp8) widened as it is read."""
    gen = torch.Generator().manual_seed(heads * 100 + num_splits)
    slots, max_len = 400, 150
    k_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(kv_dtype)
    v_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(kv_dtype)
    table = torch.stack([torch.randperm(slots, generator=gen)[:max_len] for _ in range(5)])
    rows, positions = [3, 0, 1, 4], [0, 16, 70, 149]  # 1, 17, 71 and 150 tokens
    q = torch.randn(len(rows), heads, head_dim, generator=gen).to(DTYPE)
    scale = head_dim**-0.5
    out = tk.decode_attention(
        q.to(DEVICE),
        k_cache.to(DEVICE),
        v_cache.to(DEVICE),
        table.to(DEVICE),
        torch.tensor(rows, device=DEVICE),
        torch.tensor(positions, device=DEVICE),
        scale,
        num_splits,
    )
    assert out.shape == (len(rows), heads * head_dim) and out.dtype == DTYPE
    group = heads // kv_heads
    for i, (row, pos) in enumerate(zip(rows, positions)):
        seen = table[row, : pos + 1]
        k = k_cache[seen].float().repeat_interleave(group, dim=1)  # [tokens, heads, dim]
        v = v_cache[seen].float().repeat_interleave(group, dim=1)
        weights = torch.softmax(torch.einsum("hd,thd->ht", q[i].float(), k) * scale, dim=-1)
        expected = torch.einsum("ht,thd->hd", weights, v).reshape(-1)
        close(out[i].cpu(), expected, scale=1.0)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,num_splits,min_chunk,single_max",
    [
        (4, 2, 32, 1, 128, 0),
        (6, 2, 64, 3, 64, 0),
        (2, 2, 32, 8, 64, 0),
        (8, 2, 32, 64, 128, 0),
        (6, 2, 64, 8, 64, 100),
    ],
)
@pytest.mark.parametrize("kv_dtype", [DTYPE, pytest.param(FP8, marks=STORES_FP8)])
def test_decode_attention_qkv_is_the_qk_kernel_then_decode_attention_in_one(
    qk_norm, heads, kv_heads, head_dim, num_splits, min_chunk, single_max, kv_dtype
) -> None:
    """The fused decode step from the merged projection against float32: q/k normalised and
    rotated, the new token's K/V taken from qkv and written to its slot, 1 to 3 pieces per
    request (one holding the newest token alone) merged by the last piece to finish, or with
    ``single_max`` the requests that short in one piece, the counters left at zero (the same
    buffer serves every layer and the next step: run twice). In an FP8 pool (--kv-dtype fp8) the
    new K/V are stored rounded, and attention reads them as stored."""
    gen = torch.Generator().manual_seed(heads * 100 + num_splits + qk_norm)
    slots, max_len, eps = 400, 150, 1e-6
    rotary = RotaryEmbedding(head_dim, 256, 10000.0, None, torch.float32).to(DEVICE)
    table = torch.stack([torch.randperm(slots, generator=gen)[:max_len] for _ in range(5)])
    rows, positions = (
        [3, 0, 1, 4, 2],
        [0, 16, 70, 149, 128],
    )  # pieces of 64 or 128 tokens: 1, 1, 1-2, 2-3, 2-3 of them
    out_loc = table[rows, positions]  # the newest token's slot, as the scheduler allots it
    k_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(kv_dtype)
    v_cache = torch.randn(slots, kv_heads, head_dim, generator=gen).to(kv_dtype)
    qkv = torch.randn(len(rows), (heads + 2 * kv_heads) * head_dim, generator=gen).to(DTYPE)
    q_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DTYPE) if qk_norm else None
    k_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DTYPE) if qk_norm else None
    counters = torch.zeros(len(rows) * kv_heads, dtype=torch.int32, device=DEVICE)
    k_dev, v_dev = k_cache.to(DEVICE), v_cache.to(DEVICE)
    on_device = lambda t: t.to(DEVICE) if t is not None else None  # noqa: E731
    for _ in range(2):
        out = tk.decode_attention_qkv(
            qkv.to(DEVICE),
            heads,
            kv_heads,
            head_dim,
            on_device(q_w),
            on_device(k_w),
            eps,
            rotary.cos_sin_cache,
            out_loc.to(DEVICE),
            k_dev,
            v_dev,
            table.to(DEVICE),
            torch.tensor(rows, device=DEVICE),
            torch.tensor(positions, device=DEVICE),
            head_dim**-0.5,
            num_splits,
            counters,
            min_chunk=min_chunk,
            single_max=single_max,
        )
        assert counters.tolist() == [0] * len(counters)
    assert out.shape == (len(rows), heads * head_dim) and out.dtype == DTYPE
    ref_q, ref_k, ref_v = reference_qk(
        qkv, heads, kv_heads, head_dim, q_w, k_w, eps, torch.tensor(positions), rotary
    )
    if kv_dtype == FP8:  # one rounding to e4m3 (3 mantissa bits), from float32 in the kernel
        assert torch.allclose(k_dev[out_loc].cpu().float(), ref_k.float(), rtol=2**-3, atol=2**-9)
    else:
        close(k_dev[out_loc].cpu(), ref_k)
    assert torch.equal(
        v_dev[out_loc].cpu().float(), ref_v.to(kv_dtype).float()
    )  # copied exactly (rounded once to FP8)
    others = sorted(set(range(slots)) - set(out_loc.tolist()))
    assert torch.equal(k_dev[others].cpu(), k_cache[others]) and torch.equal(
        v_dev[others].cpu(), v_cache[others]
    )
    group = heads // kv_heads
    for i, (row, pos) in enumerate(zip(rows, positions)):
        seen = table[row, : pos + 1]
        k = (
            k_dev[seen].cpu().float().repeat_interleave(group, dim=1)
        )  # the pool as written (new token included)
        v = v_dev[seen].cpu().float().repeat_interleave(group, dim=1)
        q = ref_q[i].to(DTYPE).float()  # the q/k kernel hands attention q in the model's dtype
        weights = torch.softmax(torch.einsum("hd,thd->ht", q, k) * head_dim**-0.5, dim=-1)
        expected = torch.einsum("ht,thd->hd", weights, v).reshape(-1)
        close(out[i].cpu(), expected, scale=1.0)


def test_qk_norm_rope_store_gives_larger_batches_several_heads_per_program() -> None:
    assert tk.qk_heads_per_program(1, 32) == 1  # batch-1 decode: a program per head
    assert tk.qk_heads_per_program(64, 32) == 4
    assert tk.qk_heads_per_program(256, 32) == 16
    assert (
        tk.qk_heads_per_program(8192, 8) == 8
    )  # never more rows than the heads (rounded up to a power of two)
    assert tk.qk_heads_per_program(8192, 10) == 16


def test_decode_attention_splits_fill_the_gpu_once() -> None:
    assert (
        tk.decode_attention_splits(1, 8, 132) == 64
    )  # batch 1: 8 KV heads x 64 pieces, ~4 programs per SM
    assert tk.decode_attention_splits(16, 8, 132) == 4
    assert (
        tk.decode_attention_splits(16, 8, 132, programs_per_sm=8) == 8
    )  # MINISGL_DECODE_TILES may ask for more
    assert tk.decode_attention_splits(1, 1, 132) == 64  # at most 64
    assert tk.decode_attention_splits(128, 8, 132) == 1  # a large batch fills the GPU by itself


# ---- the kernels inside the model ------------------------------------------------------------


def use_triton_everywhere(model) -> None:
    """What fused_ops.enable_fused_kernels does, minus the timing: every layer on Triton (one
    row: the one-row kernel, with the decoder's norms inside it)."""
    from minisgl_engine.layers.attention import SelfAttention
    from minisgl_engine.layers.linear import Linear
    from minisgl_engine.models.transformer import MLP, DecoderLayer

    for module in model.modules():
        if isinstance(module, DecoderLayer):
            module.norms_in_gemv = True
        elif isinstance(module, SelfAttention):
            module.fused_qk = True
        elif isinstance(module, MLP):
            module.fused_max_rows, module.gemv_plan = tk.SKINNY_MAX_ROWS, tk.GemvPlan(16)
        elif isinstance(module, Linear):
            module.skinny_max_rows, module.gemv_plan = tk.SKINNY_MAX_ROWS, tk.GemvPlan(16)


def test_norms_moved_out_of_the_products_take_the_blocks_measured_without_them(monkeypatch) -> None:
    """fused_ops.place_norms: the one-row kernel's block with the norm inside may be one that
    only wins because it removes the norm's kernel; when the norms move out again (the
    tensor-parallel fused all-reduce takes them) the products get the blocks measured without."""
    from minisgl_engine.config import ModelConfig
    from minisgl_engine.kernels import flashinfer_kernels, fused_ops
    from minisgl_engine.models.transformer import DecoderLayer

    config = ModelConfig(
        model_type="qwen3",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_context_len=128,
        tie_word_embeddings=True,
        attention_bias=False,
        qk_norm=True,
    )
    layer = DecoderLayer(config, 0)
    # qkv: cuBLAS without the norm, block 4 with it; gate_up: the row-walking grid either way
    layer.gemv_plans = {
        False: (tk.GemvPlan(), tk.GemvPlan(2, 4)),
        True: (tk.GemvPlan(4), tk.GemvPlan(1, 4)),
    }
    fused_ops.place_norms(layer, True)
    assert layer.norms_in_gemv and (layer.self_attn.qkv_proj.gemv_plan, layer.mlp.gemv_plan) == (
        (4, 0),
        (1, 4),
    )
    fused_ops.place_norms(layer, False)
    assert not layer.norms_in_gemv and (
        layer.self_attn.qkv_proj.gemv_plan,
        layer.mlp.gemv_plan,
    ) == ((0, 0), (2, 4))

    monkeypatch.setenv("MINISGL_GEMV", "nopdl")
    assert not flashinfer_kernels.pdl_wanted(torch.device("cpu"))
    monkeypatch.setenv("MINISGL_GEMV", "no-pdl")
    with pytest.raises(ValueError, match="'no-pdl': use one of on, nonorm, nopdl, off"):
        flashinfer_kernels.gemv_mode()


@pytest.mark.skipif(
    ON_GPU, reason="the GPU runs this through tests/gpu/test_cuda.py (bf16 against transformers)"
)
# qwen3 (q/k norms) and qwen2 (biases): llama3's layers are qwen2's without the biases, and the
# interpreter takes ~14 s a model
@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_model_on_triton_kernels_matches_transformers(arch, tiny_model) -> None:
    """float32 on the CPU (interpreter): prefill of up to 16 tokens and decode of two run the
    skinny products, decode of one the one-row kernel with the norms fused in, every step the fused q/k kernel; logits as
    tight as the plain path's, same greedy tokens."""
    from test_model_parity import assert_logits_close, hf_greedy, random_ids

    from minisgl_engine.llm import LLM
    from minisgl_engine.sampling_params import SamplingParams

    folder, hf = tiny_model(arch)
    llm = LLM(  # a float32 KV cache: the kernels are checked against float32 transformers
        str(folder),
        device="cpu",
        kv_dtype="float32",
        max_kv_tokens=2048,
        max_prefill_tokens=8,
        max_running_requests=4,
    )
    use_triton_everywhere(llm.engine.model)
    ids = random_ids(24, seed=5)
    ours = llm.score(ids, prefill_len=12)  # chunks of 8 and 4 tokens, then 12 decode steps
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert_logits_close(ours, ref)
    prompts = [random_ids(n, seed=n) for n in (3, 10)]
    results = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    for prompt, res in zip(prompts, results):
        assert res.token_ids == hf_greedy(hf, prompt, 6)


# ---- sampling ------------------------------------------------------------------------------------


def test_gumbel_sample_draws_from_each_rows_softmax_at_its_temperature(monkeypatch) -> None:
    """Rows at temperature 0.5 and at 3 in one call, over a vocabulary of 7 in chunks of 4 (the
    second partly masked): each half's token frequencies match softmax(logits / T) within 4
    standard deviations (the seed is fixed: the draws are too); the -inf token is never drawn;
    the same seed draws the same tokens, another seed others."""
    monkeypatch.setattr(tk, "SAMPLE_CHUNK", 4)
    n = 20000 if ON_GPU else 100  # draws per temperature (the interpreter runs ~10 ms a program)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf"), 0.5, 1.5])
    temps = torch.tensor([0.5] * n + [3.0] * n)
    ids = tk.gumbel_sample(logits.repeat(2 * n, 1).to(DEVICE), temps.to(DEVICE), seed=1234).cpu()
    assert ids.dtype == torch.int64 and ids.shape == (2 * n,)
    for half, t in ((ids[:n], 0.5), (ids[n:], 3.0)):
        expected = (logits.double() / t).softmax(-1)
        freq = torch.bincount(half, minlength=7).double() / n
        sigma = (expected * (1 - expected) / n).sqrt()
        assert freq[4] == 0
        assert ((freq - expected).abs() <= 4 * sigma + 1e-9).all(), (t, freq, expected)
    few = (
        logits.repeat(30, 1).to(DEVICE),
        temps[n - 15 : n + 15].to(DEVICE),
    )  # 15 rows of each temperature
    first, again, other = (tk.gumbel_sample(*few, seed=seed).cpu() for seed in (1234, 1234, 99))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_gumbel_sample_finds_a_token_in_a_later_chunk() -> None:
    """A 10,000-token vocabulary is three chunks of 4,096 (each read in quarters of 1,024): a
    token far likelier than the rest is the one drawn, whatever the noise, in each chunk and
    each quarter."""
    logits = torch.randn(4, 10_000, generator=torch.Generator().manual_seed(0))
    likely = [
        9_999,
        7_900,
        2_500,
        0,
    ]  # chunk 2 quarter 1, chunk 1 quarter 3, chunk 0 quarter 2, chunk 0 quarter 0
    for row, token in enumerate(likely):
        logits[row, token] = 100.0
    ids = tk.gumbel_sample(logits.to(DEVICE), torch.full((4,), 0.6).to(DEVICE), seed=7)
    assert ids.tolist() == likely
