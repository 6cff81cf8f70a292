"""The GPU's products of 4- and 8-bit group codes (engine/kernels/triton_quant.py) against the
float32 product of the same weights widened (``Planes.dequantize``).

Without a GPU they run under Triton's interpreter (numpy on the CPU, float16 activations); on a
GPU compiled, with bfloat16 activations. The codes come from every route a weight takes into
the layout: ``--quantization int4 | int8`` of a float matrix and GGUF blocks of the 32-weight and
256-weight types (random bytes with sane float16 scales), including a type re-quantized to 8 bits.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before the kernels are defined

pytest.importorskip("triton")

from minisgl_engine.kernels import triton_quant as tq  # noqa: E402
from minisgl_engine.layers.quantized import (  # noqa: E402
    Planes,
    group_codes,
    int4_planes,
    int8_planes,
    planes_of,
)
from minisgl_engine.layers.quantized_gpu import GpuGroupWeight  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
RTOL = 2**-7 if DTYPE == torch.bfloat16 else 2**-10  # one rounding of the result

# GGML type ids and (block bytes, weights per block)
Q4_0, Q4_1, Q5_K, Q6_K, Q8_0, Q4_K = 2, 3, 13, 14, 8, 12
BLOCKS = {
    Q4_0: (18, 32),
    Q4_1: (20, 32),
    Q8_0: (34, 32),
    Q4_K: (144, 256),
    Q5_K: (176, 256),
    Q6_K: (210, 256),
}


def gguf_blocks(qtype: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random blocks of ``qtype`` whose float16 scales are small and finite (random bytes would
    make some NaN or huge): [rows, bytes per row] uint8."""
    block_bytes, per_block = BLOCKS[qtype]
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0, 256, (rows, cols // per_block, block_bytes), generator=gen, dtype=torch.uint8
    )
    scales = (torch.rand(rows, cols // per_block, 2, generator=gen) * 0.02 + 0.001).half()
    if qtype == Q6_K:  # its float16 scale is the block's last two bytes
        raw[..., -2:] = scales[..., :1].contiguous().view(torch.uint8)
    else:  # d (and the minimum's scale) lead the block
        raw[..., :4] = scales.view(torch.uint8).reshape(rows, cols // per_block, 4)
    return raw.reshape(rows, -1)


def planes_for(route: str, rows: int, cols: int, seed: int) -> Planes:
    if route in ("int4", "int8"):
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(rows, cols, generator=gen) / cols**0.5
        return int4_planes(weight) if route == "int4" else int8_planes(weight)
    qtype = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q8_0": Q8_0, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}[
        route
    ]
    return planes_of(gguf_blocks(qtype, rows, cols, seed), qtype, (rows, cols))


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL) -> None:
    scale = expected.abs().max().item()
    err = (actual.float() - expected.float()).abs().max().item()
    assert err <= 2 * rtol * scale + 1e-6, f"max error {err} (scale {scale})"


ROUTES = ["int4", "int8", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


# SwiGLU is the kernel's epilogue, the same for every format: under the interpreter (~3 s a case)
# it is checked on one 4-bit and one 8-bit route, on a GPU on all
GEMV_CASES = [(route, False) for route in ROUTES] + [
    (route, True) for route in (ROUTES if ON_GPU else ["int4", "Q8_0"])
]


@pytest.mark.parametrize(("route", "silu_mul"), GEMV_CASES)
def test_group_gemv_is_the_product_of_the_widened_weight(route, silu_mul) -> None:
    """One row (batch-1 decode): the codes widened in registers, each group's scale and offset
    applied once; 4-bit codes for one plane, 8-bit for two (Q6_K re-quantized to 8 bits)."""
    rows, cols = 48, 512
    planes = planes_for(route, rows, cols, seed=len(route))
    layout = group_codes(planes).to(DEVICE)
    assert layout.kind == (4 if planes.num_planes == 1 else 8)
    wide = planes.dequantize()
    # small inputs: random GGUF bytes make large weights, and the results must fit float16
    x = (torch.randn(1, cols, generator=torch.Generator().manual_seed(1)) * 0.05).to(DTYPE)
    expected = x.float() @ wide.T
    if silu_mul:
        gate, up = expected.chunk(2, dim=-1)
        expected = torch.nn.functional.silu(gate) * up
    # codes widened by PTX (the default; compiled kernels only) and by conversion
    plans = (None, tq.GroupGemvPlan(2, 64), tq.GroupGemvPlan(8, 256, 4, False))
    for plan in plans:
        out = tq.group_gemv(
            x.to(DEVICE),
            layout.codes,
            layout.scales,
            layout.mult,
            layout.kind,
            silu_mul=silu_mul,
            plan=plan,
        )
        assert out.shape == (1, rows // 2 if silu_mul else rows) and out.dtype == DTYPE
        close(out.cpu(), expected)


@pytest.mark.parametrize("route", ["int4", "int8", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [2, 17, 70])
def test_group_matmul_is_the_product_of_the_widened_weight(route, rows) -> None:
    """Several rows (batched decode, short prefills): tensor-core tiles over codes widened in
    registers, partial row and column tiles included (70 rows, 96 outputs)."""
    planes = planes_for(route, 96, 512, seed=rows)
    layout = group_codes(planes).to(DEVICE)
    x = (torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)) * 0.05).to(DTYPE)
    expected = x.float() @ planes.dequantize().T
    for tiles in (None, tq.GroupMatmulTiles(16, 32), tq.GroupMatmulTiles(32, 64)):
        out = tq.group_matmul(
            x.to(DEVICE), layout.codes, layout.scales, layout.mult, layout.kind, tiles=tiles
        )
        assert out.shape == (rows, 96) and out.dtype == DTYPE
        # each weight rounded to the activations' dtype before the product
        close(out.cpu(), expected, 2 * RTOL)


@pytest.mark.parametrize("route", ["int4", "int8", "Q4_K", "Q6_K"])
def test_group_dequantize_writes_the_widened_weight(route) -> None:
    planes = planes_for(route, 40, 768, seed=3)  # 40 rows: a partial row tile
    layout = group_codes(planes).to(DEVICE)
    out = tq.group_dequantize(layout.codes, layout.scales, layout.mult, layout.kind, torch.float32)
    wide = planes.dequantize()
    # the scales are float16 times a power of two: exact for GGUF's float16 d, within float16's
    # step for products of d and a sub-block scale
    assert (out.cpu() - wide).abs().max().item() <= 2**-10 * wide.abs().max().item()


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_a_gpu_group_weight_multiplies_any_number_of_rows(rows) -> None:
    """``GpuGroupWeight.matmul``: one row through the one-row kernel, a few through the tiled
    kernel, many through the widened weight; float32 results on request (an LM head's logits)."""
    planes = planes_for("Q4_K", 64, 256, seed=5)
    weight = GpuGroupWeight(group_codes(planes).to(DEVICE))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(2)).to(DTYPE)
    expected = x.float() @ planes.dequantize().T
    out = weight.matmul(x.to(DEVICE), out_dtype=torch.float32)
    assert out.shape == (rows, 64) and out.dtype == torch.float32
    close(out.cpu(), expected)
    assert weight.nbytes == 64 * 256 // 2 + 64 * (256 // 32) * 2 * 2  # codes + f16 scale, offset


def test_group_block_k_keeps_the_tile_within_the_register_budget() -> None:
    assert tq.group_block_k(4096, 4) == 2048
    assert tq.group_block_k(576, 4) == 64  # 9 x 64: the demo model's hidden size
    assert tq.group_block_k(12288, 8) == 1024


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_model_on_group_weights_gives_the_logits_of_its_widened_weights(kind, tiny_model) -> None:
    """The model's side of the GPU's quantized weights (without a GPU: on the CPU, the kernels
    interpreted): every projection and the untied LM head held as group codes, SwiGLU inside
    the one-row kernel, logits in float32; the same logits as the model whose weights are
    those codes widened, batched (the widened-weight path) and one sequence alone (one row)."""
    from minisgl_engine.layers.linear import Linear
    from minisgl_engine.layers.quantized import drop_weight, quantize_float
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model("qwen3")
    # (on a GPU without the fused kernels, whose one-row plans were measured on the widened weights)
    llm = LLM(
        str(folder),
        device=DEVICE.type,
        dtype="float32",
        attn="torch",
        cuda_graph_max_bs=0,
        fused_kernels=False,
    )
    model = llm.engine.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert model.lm_head in linears  # tiny qwen3: an untied head
    planes = [quantize_float(m.weight.data.float(), kind) for m in linears]
    for module, p in zip(linears, planes):
        module.weight.data.copy_(p.dequantize().to(DEVICE))
    rng = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 320, (n,), generator=rng).tolist() for n in (9, 14, 21)]
    starts = [len(s) - 4 for s in seqs]
    widened = llm.score_batch(seqs, starts) + llm.score_batch(seqs[:1], starts[:1])
    for module, p in zip(linears, planes):
        module.quant = GpuGroupWeight(group_codes(p).to(DEVICE))
        module.weight = drop_weight(module.weight)
    grouped = llm.score_batch(seqs, starts) + llm.score_batch(seqs[:1], starts[:1])
    for ours, want in zip(grouped, widened):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4)


def test_a_group_kernel_that_fails_here_is_turned_off_and_its_rows_widen(monkeypatch) -> None:
    """At load the engine runs each kernel once (check_group_kernels): one that does not compile
    on this Triton or GPU is turned off, and its rows go through the widened weight instead."""
    from minisgl_engine.layers import quantized_gpu

    def broken(*args, **kwargs):
        raise RuntimeError("no such instruction on this GPU")

    monkeypatch.setattr(tq, "group_matmul", broken)
    monkeypatch.setattr(GpuGroupWeight, "tiled_max_rows", quantized_gpu.TILED_MAX_ROWS)
    monkeypatch.setattr(GpuGroupWeight, "one_row_kernel", True)
    assert quantized_gpu.check_group_kernels(DEVICE, DTYPE) == ["tiled"]
    assert GpuGroupWeight.tiled_max_rows == 1 and GpuGroupWeight.one_row_kernel
    planes = planes_for("int4", 64, 256, seed=9)
    weight = GpuGroupWeight(group_codes(planes).to(DEVICE))
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3)).to(DTYPE)
    close(weight.matmul(x.to(DEVICE)).cpu(), x.float() @ planes.dequantize().T, 2 * RTOL)
