"""The one-row group kernel (kernels/triton_quant.py) at the Qwen3-8B shapes, 4- and 8-bit codes,
under several plans (rows per program, inputs per step, warps), against bf16 cuBLAS and the
read bound: which plan to make the default. Weights rotate over enough copies that the L2 cache
holds none of them between calls (as in a decode step, where each layer's weights are read once).

    python scripts/gpu_group_sweep.py [--one-row]   (--one-row: not the several-row kernels)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gpu_timing import graph_us  # noqa: E402

from minisgl_engine.kernels import triton_quant as tq  # noqa: E402
from minisgl_engine.layers.quantized import group_codes, int4_planes, int8_planes  # noqa: E402

SHAPES = {  # name: (rows, inputs, silu_mul)
    "qkv_proj": (6144, 4096, False),
    "o_proj": (4096, 4096, False),
    "gate_up_proj+silu": (2 * 12288, 4096, True),
    "down_proj": (4096, 12288, False),
}
PLANS = [  # (rows, inputs per step, warps, codes widened by PTX; False: by conversion)
    tq.GroupGemvPlan(*p)
    for p in (
        (4, 1024, 4, False),
        (4, 2048, 4, False),
        (2, 2048, 4, True),
        (4, 1024, 4, True),
        (4, 2048, 4, True),
        (8, 1024, 8, True),
        (8, 512, 4, True),
        (16, 512, 8, True),
    )
]
MATMUL_ROWS = (2, 8, 16, 32, 64, 128, 256, 512, 2048)
MATMUL_TILES = [
    tq.GroupMatmulTiles(*t)
    for t in (
        (16, 32, 4, 3),
        (16, 64, 4, 3),
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (64, 128, 8, 3),
        (128, 128, 8, 3),
        (128, 64, 4, 4),
    )
]
BANDWIDTH_GBS = float(os.environ.get("READ_GBS", "4800"))  # H200's HBM3e; H100 SXM: 3350


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), f"(read bound at {BANDWIDTH_GBS:.0f} GB/s)")
    for name, (rows, cols, silu) in SHAPES.items():
        x = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16)
        w16 = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) / cols**0.5
        copies = max(2, int(400e6 // (rows * cols * 2)))
        bf16 = [w16.clone() for _ in range(copies)]
        it = iter(range(10**9))
        us = graph_us(lambda: F.linear(x, bf16[next(it) % copies]))
        print(
            f"{name} {rows}x{cols}: bf16 cuBLAS {us:.1f} us ({rows * cols * 2 / us / 1e3:.0f} GB/s)"
        )
        bf16.clear()
        for bits, planes_of in ((4, int4_planes), (8, int8_planes)):
            layout = group_codes(planes_of(w16.float()))
            copies = max(2, int(400e6 // layout.nbytes))
            layouts = [(layout.codes.clone(), layout.scales.clone()) for _ in range(copies)]
            nbytes = layout.nbytes
            plans = (
                PLANS
                if bits == 4
                else [
                    tq.GroupGemvPlan(4, 1024, 4, False),
                    tq.GroupGemvPlan(4, 1024, 4, True),
                    tq.GroupGemvPlan(8, 512, 4, True),
                ]
            )
            results = []
            for plan in [tq.default_gemv_plan(cols, bits)] + plans:
                if cols % plan.block_k:
                    continue
                it = iter(range(10**9))

                def run(plan=plan):
                    codes, scales = layouts[next(it) % copies]
                    return tq.group_gemv(
                        x, codes, scales, layout.mult, bits, silu_mul=silu, plan=plan
                    )

                try:
                    us = graph_us(run)
                except Exception as exc:  # a plan that does not compile (registers)
                    print(f"  {bits}-bit {tuple(plan)}: {type(exc).__name__}")
                    continue
                results.append((us, tuple(plan)))
            results.sort()
            bound = nbytes / (BANDWIDTH_GBS * 1e3)
            best = ", ".join(f"{p}: {us:.1f} us" for us, p in results[:4])
            print(
                f"  {bits}-bit ({nbytes / 2**20:.1f} MiB, bound {bound:.1f} us): default {tuple(tq.default_gemv_plan(cols, bits))}"
                f" {next(us for us, p in results if p == tuple(tq.default_gemv_plan(cols, bits))):.1f} us; best {best}"
            )
            layouts.clear()


def matmuls() -> None:
    """Several rows: the tiled kernel (codes widened in registers) at its tiles, against the weight
    widened into memory then cuBLAS, and bf16 cuBLAS; 4-bit codes."""
    for name in ("qkv_proj", "down_proj"):
        rows_w, cols, _ = SHAPES[name]
        w16 = torch.randn(rows_w, cols, device="cuda", dtype=torch.bfloat16) / cols**0.5
        layout = group_codes(int4_planes(w16.float()))
        for m in MATMUL_ROWS:
            x = torch.randn(m, cols, device="cuda", dtype=torch.bfloat16)
            bf16 = graph_us(lambda: F.linear(x, w16), calls=5, replays=5)
            widened = graph_us(
                lambda: F.linear(
                    x,
                    tq.group_dequantize(
                        layout.codes, layout.scales, layout.mult, 4, torch.bfloat16
                    ),
                ),
                calls=5,
                replays=5,
            )
            tiled = []
            for tiles in [tq.group_matmul_tiles(m)] + MATMUL_TILES:
                try:
                    us = graph_us(
                        lambda tiles=tiles: tq.group_matmul(
                            x, layout.codes, layout.scales, layout.mult, 4, tiles=tiles
                        ),
                        calls=5,
                        replays=5,
                    )
                except Exception as exc:
                    print(f"    {tuple(tiles)}: {type(exc).__name__}")
                    continue
                tiled.append((round(us, 1), tuple(tiles)))
            default = tiled[0]
            print(
                f"{name} {m} rows: bf16 cuBLAS {bf16:.1f} us, widened + cuBLAS {widened:.1f} us, tiled default {default}, best {sorted(tiled)[:3]}"
            )


if __name__ == "__main__":
    main()
    if "--one-row" not in sys.argv:
        matmuls()
