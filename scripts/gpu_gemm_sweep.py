"""The decoder layer's four products of the Qwen3-0.6B shape at the row counts of nano-vllm's
offline workload (decode steps of 16-256 requests) and of a prefill chunk: cuBLAS (as the engine
runs them, gate/up followed by the SwiGLU kernel), cuBLASLt, and ``triton_kernels.matmul`` under
each tiling (with SwiGLU fused in for gate/up). Run on the device through
``scripts/gpu_check.sh gemmsweep``: is there a tiling that beats cuBLAS where the offline
workload spends its steps, and by how much per decode step?

Each timing is one CUDA graph of 20 calls replayed 10 times (scripts/gpu_timing.py). Every tiling
is compiled first, in a pool of processes (one compile per tiling and shape: minutes in one).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F
from gpu_timing import graph_us

from minisgl_engine.kernels.triton_kernels import MatmulTiles, matmul
from minisgl_engine.layers.activation import silu_and_mul

DEV = torch.device("cuda")
HIDDEN, INTER, QKV, ATTN_OUT = 1024, 3072, 4096, 2048
# name: (output features, reduction, SwiGLU fused in)
PRODUCTS = {
    "qkv": (QKV, HIDDEN, False),
    "o": (HIDDEN, ATTN_OUT, False),
    "gate_up": (2 * INTER, HIDDEN, True),
    "down": (HIDDEN, INTER, False),
}
DECODE_ROWS = (16, 32, 64, 96, 128, 192, 256)
PREFILL_ROWS = 8192
GRID = [
    MatmulTiles(m, n, k, w, s)
    for m, n, k, (w, s) in itertools.product(
        (16, 32, 64, 128), (32, 64, 128), (64, 128), ((4, 3), (8, 4))
    )
]


def inputs(name: str, rows: int):
    n, k, _ = PRODUCTS[name]
    gen = torch.Generator(device=DEV).manual_seed(rows + n + k)
    x = torch.randn(rows, k, device=DEV, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen) / k**0.5
    return x, w


def compile_one(job) -> str:
    """Compile (and run once) one tiling of one product, in a worker process: fills Triton's cache."""
    name, tiles = job
    x, w = inputs(name, 64)
    try:
        matmul(x, w, silu_mul=PRODUCTS[name][2], tiles=tiles)
        torch.cuda.synchronize()
        return ""
    except (
        Exception
    ) as exc:  # a tiling that does not fit (shared memory, registers): left out later too
        return f"{name} {tuple(tiles)}: {type(exc).__name__}: {str(exc)[:100]}"


def cublas(name: str, x, w):
    if PRODUCTS[name][2]:
        return lambda: silu_and_mul(F.linear(x, w), fused=True)
    return lambda: F.linear(x, w)


def main() -> None:
    jobs = [(name, tiles) for name in PRODUCTS for tiles in GRID]
    with ProcessPoolExecutor(
        min(14, os.cpu_count() or 4), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        failed = [msg for msg in pool.map(compile_one, jobs) if msg]
    for msg in failed:
        print("  not compiled:", msg)
    per_layer: dict[int, dict[str, float]] = {rows: {} for rows in DECODE_ROWS}
    ranking: dict[str, dict[MatmulTiles, list[float]]] = {name: {} for name in PRODUCTS}
    for name, (n, k, silu) in PRODUCTS.items():
        for rows in DECODE_ROWS + (PREFILL_ROWS,):
            x, w = inputs(name, rows)
            reference = cublas(name, x, w)().float()
            base = graph_us(cublas(name, x, w), calls=20, replays=10)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            lt = graph_us(cublas(name, x, w), calls=20, replays=10)
            torch.backends.cuda.preferred_blas_library("cublas")
            times = {}
            for tiles in GRID if rows != PREFILL_ROWS else [t for t in GRID if t.block_m >= 64]:
                call = lambda: matmul(x, w, silu_mul=silu, tiles=tiles)  # noqa: E731
                try:
                    err = ((call().float() - reference).abs().max() / reference.abs().max()).item()
                except Exception:  # not compiled above
                    torch.cuda.synchronize()
                    continue
                if err > 2e-2:
                    print(
                        f"  {name} rows {rows} {tuple(tiles)}: differs from cuBLAS by {err:.3g}; left out"
                    )
                    continue
                times[tiles] = graph_us(call, calls=20, replays=10)
            best = min(times, key=times.get)
            flops = 2 * rows * n * k
            print(
                f"{name:8s} rows {rows:5d}: cuBLAS {base:8.2f} us ({flops / base / 1e6:6.1f} TFLOP/s), cuBLASLt {lt:8.2f}, "
                f"Triton best {times[best]:8.2f} {tuple(best)} ({base / times[best]:4.2f}x)",
                flush=True,
            )
            if rows != PREFILL_ROWS:
                per_layer[rows].update(
                    {f"{name} cublas": base, f"{name} lt": lt, f"{name} triton": times[best]}
                )
                for tiles, us in times.items():
                    ranking[name].setdefault(tiles, []).append(us / base)
    for rows, t in per_layer.items():
        cub = sum(v for key, v in t.items() if key.endswith("cublas"))
        lt = sum(v for key, v in t.items() if key.endswith(" lt"))
        tri = sum(min(t[f"{name} cublas"], t[f"{name} triton"]) for name in PRODUCTS)
        print(
            f"rows {rows:4d}: a layer's products (gate/up with SwiGLU) cuBLAS {cub:7.2f} us, cuBLASLt {lt:7.2f}, "
            f"the faster of cuBLAS / Triton's best per product {tri:7.2f} us: {28 * (cub - tri):6.1f} us less per 28-layer step"
        )
    # one tiling per product for every decode row count: the least mean time relative to cuBLAS
    for name, per_tiles in ranking.items():
        full = {t: v for t, v in per_tiles.items() if len(v) == len(DECODE_ROWS)}
        ranked = sorted(full, key=lambda t: sum(full[t]))
        for tiles in ranked[:4]:
            print(
                f"{name:8s} tiling {tuple(tiles)}: relative to cuBLAS at rows {DECODE_ROWS}: "
                + " ".join(f"{v:.2f}" for v in full[tiles])
            )
        if ranked:
            print(f"BEST {name} " + ",".join(str(v) for v in ranked[0]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
