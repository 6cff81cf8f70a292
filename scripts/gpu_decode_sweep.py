"""The split kernel of ``triton_kernels.decode_attention`` under each tiling (tokens per loop
step, warps, pipeline stages, programs per SM), at the batch sizes and contexts of batch-1
decode and of nano-vllm's offline workload (Qwen3-0.6B's heads: 16 query, 8 KV, 128 dims).
Run on the device through ``scripts/gpu_check.sh decodesweep``; the last line names the tiling
that was fastest over the offline workload's batches, for ``MINISGL_DECODE_TILES``.

Each timing is one CUDA graph of 10 calls replayed 10 times (scripts/gpu_timing.py); the K/V of each request sits in
consecutive slots (as a prefill writes them), and once in shuffled slots (a pool after churn).
Each tiling and split count is a kernel of its own to build: a run takes a few minutes.
"""

from __future__ import annotations

import itertools
import sys

import torch
from gpu_timing import graph_us

from minisgl_engine.kernels.triton_kernels import (
    DecodeTiles,
    decode_attention,
    decode_attention_splits,
)

DEV = torch.device("cuda")
HEADS, KV_HEADS, DIM = 16, 8, 128
# (batch, context, shuffled slots); the offline workload's steps are batches of 16-256 at ~1,000 tokens
SHAPES = [
    (1, 1024, False),
    (4, 1024, False),
    (16, 1024, False),
    (32, 1024, False),
    (64, 1024, False),
    (128, 1024, False),
    (256, 1024, False),
    (64, 2048, False),
    (256, 512, False),
    (64, 1024, True),
]
OFFLINE = [s for s in SHAPES if s[0] >= 16]
GRID = [
    DecodeTiles(*t) for t in itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4), (4, 8, 16, 32))
]


def main() -> None:
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    default = DecodeTiles()
    times: dict[tuple, dict[DecodeTiles, float]] = {}
    for batch, ctx, shuffled in SHAPES:
        gen = torch.Generator(device=DEV).manual_seed(batch * ctx)
        slots = batch * ctx + 1
        k = torch.randn(slots, KV_HEADS, DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(slots, KV_HEADS, DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
        order = (
            torch.randperm(batch * ctx, device=DEV, generator=gen)
            if shuffled
            else torch.arange(batch * ctx, device=DEV)
        )
        table = order.view(batch, ctx).to(torch.int32).contiguous()
        rows = torch.arange(batch, device=DEV)
        positions = torch.full((batch,), ctx - 1, device=DEV)
        q = torch.randn(batch, HEADS, DIM, device=DEV, dtype=torch.bfloat16, generator=gen)
        kv_bytes = 2 * batch * ctx * KV_HEADS * DIM * 2
        reference = decode_attention(
            q,
            k,
            v,
            table,
            rows,
            positions,
            DIM**-0.5,
            decode_attention_splits(batch, KV_HEADS, sms, default.programs_per_sm),
            tiles=default,
        )
        shape_times = times[batch, ctx, shuffled] = {}
        for tiles in GRID:
            splits = decode_attention_splits(batch, KV_HEADS, sms, tiles.programs_per_sm)
            call = lambda: decode_attention(  # noqa: E731
                q, k, v, table, rows, positions, DIM**-0.5, splits, tiles=tiles
            )
            try:
                diff = (call().float() - reference.float()).abs().max().item()
                if diff > 2e-2:
                    print(
                        f"  {tiles}: differs from the default tiling by {diff:.3g}; left out",
                        flush=True,
                    )
                    continue
                shape_times[tiles] = graph_us(call, calls=10, replays=10)
            except Exception as exc:  # a tiling that does not fit (shared memory): left out
                print(f"  {tuple(tiles)}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                torch.cuda.synchronize()
        best = min(shape_times, key=shape_times.get)
        us = shape_times[best]
        print(
            f"batch {batch:3d} ctx {ctx:5d}{' shuffled' if shuffled else ''}: default {tuple(default)} "
            f"{shape_times[default]:8.2f} us = {kv_bytes / shape_times[default] / 1e6:5.2f} TB/s; best {tuple(best)} "
            f"{us:8.2f} us = {kv_bytes / us / 1e6:5.2f} TB/s",
            flush=True,
        )
        for tiles in sorted(shape_times, key=shape_times.get)[:5]:
            print(f"    {tuple(tiles)}: {shape_times[tiles]:8.2f} us", flush=True)
    # one tiling for every offline batch: the least total time over their shapes (each shape's
    # time relative to its own best, so the big shapes do not decide alone)
    common = set.intersection(*(set(times[s]) for s in OFFLINE))
    score = {
        t: sum(times[s][t] / min(times[s].values()) for s in OFFLINE) / len(OFFLINE) for t in common
    }
    ranked = sorted(score, key=score.get)
    for tiles in ranked[:8]:
        per_shape = " ".join(f"{times[s][tiles]:.1f}" for s in OFFLINE)
        print(
            f"offline tiling {tuple(tiles)}: {score[tiles]:.3f} of each shape's best on average (us: {per_shape})"
        )
    print(
        f"default {tuple(default)}: {score.get(default, float('nan')):.3f} of each shape's best on average"
    )
    print("BEST_OFFLINE " + ",".join(str(x) for x in ranked[0]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
