"""Switching a model on CUDA to the Triton kernels of :mod:`.triton_kernels`.

The fused q/k norm + RoPE + KV store kernel replaces five launches with one and is always used.
Whether the skinny matrix product (alone, or with SwiGLU fused in) beats cuBLAS depends on the
GPU and the layer's shape, so it is measured here once at start-up: for each distinct weight
shape and each row count up to 16, both are timed inside a CUDA graph (the way decode steps
run), and a layer uses the Triton kernel up to the largest row count at which it had not yet
lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .flashinfer_kernels import triton_unavailable_reason

logger = logging.getLogger(__name__)

ROW_COUNTS = (1, 2, 4, 8, 16)


def gpu_time_us(fn: Callable[[], object], reps: int = 20) -> float:
    """GPU time of one call of ``fn``: ``reps`` calls captured in a CUDA graph, best of 3 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()  # compiles / warms up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / reps)
    return best


def faster_up_to(ours: Callable[[int], Callable[[], object]], theirs: Callable[[int], Callable[[], object]]) -> tuple[int, list]:
    """The largest row count up to which ``ours(rows)`` is never slower than ``theirs(rows)``
    (0: already slower at one row), and the timings ``(rows, ours µs, theirs µs)``."""
    timings = []
    best = 0
    for rows in ROW_COUNTS:
        mine, other = gpu_time_us(ours(rows)), gpu_time_us(theirs(rows))
        timings.append((rows, round(mine, 2), round(other, 2)))
        if mine > other:
            break
        best = rows
    return best, timings


def choose(linear, silu_mul: bool) -> tuple[int, list]:
    """Rows up to which ``skinny_matmul`` (with SwiGLU fused in when ``silu_mul``) beats what
    runs otherwise: cuBLAS (and FlashInfer's SwiGLU kernel)."""
    from .layers.activation import silu_and_mul
    from .triton_kernels import skinny_block_k, skinny_matmul

    weight, bias = linear.weight, linear.bias
    if skinny_block_k(weight.shape[1]) is None:
        return 0, []

    def ours(rows: int):
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
        return lambda: skinny_matmul(x, weight, bias, silu_mul=silu_mul)

    def theirs(rows: int):
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
        if silu_mul:
            return lambda: silu_and_mul(F.linear(x, weight, bias), fused=True)
        return lambda: F.linear(x, weight, bias)

    return faster_up_to(ours, theirs)


def enable_fused_kernels(model: nn.Module, on_phase: Callable[[str], None] | None = None) -> dict[str, object]:
    """Switch ``model`` (on CUDA, FlashInfer ops already on) to the Triton kernels where they
    help. Returns what was chosen, for the start-up log and the benchmarks."""
    reason = triton_unavailable_reason()
    if reason is not None:
        logger.warning("fused kernels off: Triton is not usable here (%s)", reason)
        return {"triton": False}
    from .models.transformer import DecoderLayer

    message = "measuring the small-batch matrix kernels against cuBLAS (a few seconds)"
    logger.info(message)
    if on_phase is not None:
        on_phase(message)
    report: dict[str, object] = {"triton": True}
    chosen: dict[tuple, int] = {}  # one measurement per distinct shape and kind

    def decide(label: str, linear, silu_mul: bool = False) -> int:
        key = (label, tuple(linear.weight.shape), linear.bias is not None)
        if key not in chosen:
            rows, timings = choose(linear, silu_mul)
            chosen[key] = rows
            report[label] = {"max_rows": rows, "timings_us": timings}
            logger.info("%s %s: Triton up to %d rows (rows, Triton us, otherwise us: %s)", label, key[1], rows, timings)
        return chosen[key]

    for layer in model.modules():
        if not isinstance(layer, DecoderLayer):
            continue
        attn, mlp = layer.self_attn, layer.mlp
        attn.fused_qk = True
        attn.qkv_proj.skinny_max_rows = decide("qkv_proj", attn.qkv_proj)
        attn.o_proj.skinny_max_rows = decide("o_proj", attn.o_proj)
        mlp.fused_max_rows = decide("gate_up_proj+silu", mlp.gate_up_proj, silu_mul=True)
        mlp.down_proj.skinny_max_rows = decide("down_proj", mlp.down_proj)
    torch.cuda.synchronize()
    return report


def enable_fused_all_reduce_norm(model: nn.Module, device: torch.device, hidden_size: int,
                                 on_phase: Callable[[str], None] | None = None) -> bool:
    """Under tensor parallelism on GPUs: each decoder layer's two row-parallel projections leave
    their all-reduce to the RMSNorm after them, which does all-reduce, residual add and norm in
    one kernel (distributed.FusedAllReduceNorm). Every rank calls this; False where it is off."""
    from .distributed import set_up_fused_all_reduce_norm
    from .models.transformer import DecoderLayer, DecoderModel

    message = "setting up the fused all-reduce + RMSNorm kernel (built on the first run only)"
    logger.info(message)
    if on_phase is not None:
        on_phase(message)
    if not set_up_fused_all_reduce_norm(device, hidden_size):
        return False
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            # attention's output goes to post_attention_layernorm, the MLP's to the next layer's
            # input_layernorm (or the final norm): buffers as the projections' own all-reduces
            module.self_attn.o_proj.leaves_all_reduce = True
            module.post_attention_layernorm.takes_all_reduce = module.self_attn.o_proj.all_reduce_buffer
            module.mlp.down_proj.leaves_all_reduce = True
            module.input_layernorm.takes_all_reduce = module.mlp.down_proj.all_reduce_buffer
        elif isinstance(module, DecoderModel):
            module.norm.takes_all_reduce = module.layers[-1].mlp.down_proj.all_reduce_buffer
    return True
