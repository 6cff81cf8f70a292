"""Switching a model on CUDA to the Triton kernels of :mod:`.triton_kernels`.

The fused q/k norm + RoPE + KV store kernel replaces five launches with one and is always used.
Whether the skinny matrix product (alone, or with SwiGLU fused in) beats cuBLAS depends on the
GPU and the layer's shape, so it is measured here once at start-up: for each distinct weight
shape and each row count up to 16, both are timed inside a CUDA graph (the way decode steps
run), and a layer uses the Triton kernel up to the largest row count at which it had not yet
lost. At one row (batch-1 decode, the chat case) the one-row kernel (``gemv``) is timed too, in
each of its plans (``gemv_plans``), and runs where it is fastest. For the two products that
follow a norm (qkv, gate_up) each plan is also timed with the residual add + RMSNorm inside
(``add_norm_gemv``) against the norm's own kernel plus the fastest product without it; where
the norm inside wins for both, the layer's two norms move into them. On Hopper these kernels
start while the kernel before them finishes (programmatic dependent launch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .cuda_graph import no_collection_while_capturing
from .flashinfer_kernels import gemv_mode, pdl_wanted, triton_unavailable_reason

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


def faster_up_to(
    ours: Callable[[int], Callable[[], object]], theirs: Callable[[int], Callable[[], object]]
) -> tuple[int, list]:
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


def input_dtype(linear) -> torch.dtype:
    """The dtype of a product's input: the weight's, or an FP8 layer's activations'."""
    return linear.compute_dtype or linear.weight.dtype


def cublas(linear, silu_mul: bool, rows: int) -> Callable[[], object]:
    """What runs without the Triton kernels: cuBLAS (and FlashInfer's SwiGLU kernel); for an
    FP8 layer, its FP8 tensor-core product (layers/fp8.py)."""
    from ..layers.activation import silu_and_mul
    from ..layers.fp8 import fp8_linear

    weight, bias, scale = linear.weight, linear.bias, linear.weight_scale
    x = torch.randn(rows, weight.shape[1], dtype=input_dtype(linear), device=weight.device)

    def product():
        return F.linear(x, weight, bias) if scale is None else fp8_linear(x, weight, scale, bias)

    if silu_mul:
        return lambda: silu_and_mul(product(), fused=True)
    return product


def choose(linear, silu_mul: bool) -> tuple[int, list]:
    """Rows up to which ``skinny_matmul`` (with SwiGLU fused in when ``silu_mul``) beats
    cuBLAS (and FlashInfer's SwiGLU kernel)."""
    from .triton_kernels import skinny_block_k, skinny_matmul

    weight, bias = linear.weight, linear.bias
    if skinny_block_k(weight.shape[1]) is None or linear.weight_scale is not None:
        return 0, []  # (the skinny kernel multiplies 16-bit weights only)

    def ours(rows: int):
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
        return lambda: skinny_matmul(x, weight, bias, silu_mul=silu_mul)

    return faster_up_to(ours, lambda rows: cublas(linear, silu_mul, rows))


def residual_norm_us(norm) -> float:
    """GPU time of a decoder layer's residual add + RMSNorm at one row (the kernel that
    ``add_norm_gemv`` makes unnecessary)."""
    weight = norm.weight
    x = torch.randn(1, weight.shape[0], dtype=weight.dtype, device=weight.device)
    residual = torch.randn_like(x)
    return gpu_time_us(lambda: norm(x, residual))


def gemv_plans() -> tuple:
    """The one-row kernel's plans measured for each product: a program per 4 or 8 weight rows,
    or 4 programs per SM walking the rows 1 or 2 at a time (triton_kernels.GemvPlan)."""
    from .triton_kernels import GemvPlan

    return (GemvPlan(4), GemvPlan(8), GemvPlan(1, 4), GemvPlan(2, 4))


def choose_gemv(
    linear, silu_mul: bool, pdl: bool, best_us: float, norm=None
) -> tuple[tuple[int, int], list]:
    """The plan of :func:`gemv` that beats ``best_us`` (the fastest other way) by the most,
    ``(0, 0)`` if none does, and the timings ``(plan, µs)``. With ``norm`` (the RMSNorm in front
    of the product) each plan is timed as it then runs: ``add_norm_gemv``, the norm inside."""
    from .triton_kernels import GemvPlan, add_norm_gemv, gemv, gemv_block_k

    weight, bias, scale = linear.weight, linear.bias, linear.weight_scale
    x = torch.randn(1, weight.shape[1], dtype=input_dtype(linear), device=weight.device)
    residual = torch.randn_like(x)
    timings, best_plan = [], GemvPlan()
    for plan in gemv_plans():
        if (
            not plan.per_sm
            and gemv_block_k(weight.shape[1], plan.block_n, weight.element_size()) is None
        ):
            continue
        if norm is None:

            def run(plan=plan):
                return gemv(
                    x,
                    weight,
                    bias,
                    silu_mul=silu_mul,
                    block_n=plan.block_n,
                    per_sm=plan.per_sm,
                    pdl=pdl,
                    scale=scale,
                )
        else:

            def run(plan=plan):
                return add_norm_gemv(
                    x,
                    residual,
                    norm.weight,
                    norm.eps,
                    weight,
                    bias,
                    silu_mul=silu_mul,
                    block_n=plan.block_n,
                    per_sm=plan.per_sm,
                    pdl=pdl,
                    scale=scale,
                )

        try:
            us = gpu_time_us(run)
        except Exception as exc:  # a Triton that cannot build it here: serve without it
            logger.warning(
                "the one-row kernel (plan %s, pdl %s) did not run: %s", tuple(plan), pdl, exc
            )
            continue
        timings.append((tuple(plan), round(us, 2)))
        if us < best_us:
            best_us, best_plan = us, plan
    return best_plan, timings


class _KernelChoices:
    """Which kernels run each linear layer, measured once per distinct shape and kind (every
    decoder layer shares them); each measurement also goes into ``report``."""

    def __init__(self, mode: str, pdl: bool, norm_us: float, report: dict[str, object]) -> None:
        self.mode, self.pdl, self.norm_us, self.report = mode, pdl, norm_us, report
        self.chosen: dict[tuple, tuple[int, tuple[int, int], tuple[int, int]]] = {}

    def decide(
        self, label: str, linear, silu_mul: bool = False, norm=None
    ) -> tuple[int, tuple[int, int], tuple[int, int]]:
        """(rows up to which the skinny kernel runs, the one-row kernel's plan or (0, 0), the
        same where the layer's norm moves into the product: timed with the norm inside against
        the norm's kernel plus the fastest product without it). A layer with quantized
        weights keeps its own kernels (layers/quantized_gpu.py)."""
        if linear.quant is not None:
            self.report[label] = {"quantized": True}
            return 0, (0, 0), (0, 0)
        key = (label, tuple(linear.weight.shape), linear.bias is not None)
        if key not in self.chosen:
            self.chosen[key] = self._measure(label, key, linear, silu_mul, norm)
        return self.chosen[key]

    def _measure(
        self, label: str, key: tuple, linear, silu_mul: bool, norm
    ) -> tuple[int, tuple[int, int], tuple[int, int]]:
        rows, timings = choose(linear, silu_mul)
        plan, gemv_timings, with_norm, norm_timings = (0, 0), [], (0, 0), []
        if self.mode != "off":
            best = min(timings[0][1:]) if timings else gpu_time_us(cublas(linear, silu_mul, 1))
            plan, gemv_timings = choose_gemv(linear, silu_mul, self.pdl, best)
            if norm is not None and self.mode == "on":
                separate = self.norm_us + min([best] + [us for _, us in gemv_timings])
                with_norm, norm_timings = choose_gemv(
                    linear, silu_mul, self.pdl, separate, norm=norm
                )
        self.report[label] = {
            "max_rows": rows,
            "timings_us": timings,
            "gemv_plan": tuple(plan),
            "gemv_timings_us": gemv_timings,
            "gemv_plan_with_norm": tuple(with_norm),
            "gemv_with_norm_timings_us": norm_timings,
        }
        logger.info(
            "%s %s: Triton up to %d rows (rows, Triton us, otherwise us: %s); one row: %s (plan, us: %s)%s",
            label,
            key[1],
            rows,
            timings,
            f"gemv plan {tuple(plan)}" if plan[0] else "as above",
            gemv_timings,
            f"; with the norm inside: gemv plan {tuple(with_norm)} (plan, us: {norm_timings})"
            if norm is not None
            else "",
        )
        return rows, tuple(plan), tuple(with_norm)


def _use_choices(layer: nn.Module, choices: _KernelChoices) -> None:
    """Set one decoder layer's products to the kernels chosen for their shapes."""
    decide, pdl = choices.decide, choices.pdl
    attn, mlp = layer.self_attn, layer.mlp
    attn.fused_qk, attn.qk_pdl = True, pdl
    qkv, o, down, gate_up = (
        decide("qkv_proj", attn.qkv_proj, norm=layer.input_layernorm),
        decide("o_proj", attn.o_proj),
        decide("down_proj", mlp.down_proj),
        decide(
            "gate_up_proj+silu",
            mlp.gate_up_proj,
            silu_mul=True,
            norm=layer.post_attention_layernorm,
        ),
    )
    for linear, (rows, plan) in (
        (attn.qkv_proj, qkv[:2]),
        (attn.o_proj, o[:2]),
        (mlp.down_proj, down[:2]),
    ):
        linear.skinny_max_rows, linear.gemv_plan, linear.gemv_pdl = rows, plan, pdl
    mlp.fused_max_rows, mlp.gemv_plan, mlp.gemv_pdl = gate_up[0], gate_up[1], pdl
    # the norms ride inside both one-row products where both can take them (the
    # tensor-parallel fused all-reduce takes them back out: enable_fused_all_reduce_norm)
    layer.gemv_plans = {False: (qkv[1], gate_up[1]), True: (qkv[2], gate_up[2])}
    place_norms(layer, choices.mode == "on" and qkv[2][0] > 0 and gate_up[2][0] > 0)


def enable_fused_kernels(
    model: nn.Module, on_phase: Callable[[str], None] | None = None
) -> dict[str, object]:
    """Switch ``model`` (on CUDA, FlashInfer ops already on) to the Triton kernels where they
    help. Returns what was chosen, for the start-up log and the benchmarks."""
    reason = triton_unavailable_reason()
    if reason is not None:
        logger.warning("fused kernels off: Triton is not usable here (%s)", reason)
        return {"triton": False}
    from ..models.transformer import DecoderLayer

    message = "measuring the small-batch matrix kernels against cuBLAS (a few seconds)"
    logger.info(message)
    if on_phase is not None:
        on_phase(message)
    report: dict[str, object] = {"triton": True}
    mode = gemv_mode()
    pdl = pdl_wanted(next(model.parameters()).device)
    report["gemv"] = mode if mode == "off" else ("pdl" if pdl else "plain launches")

    with no_collection_while_capturing():  # each timing is a captured graph
        norm_us = 0.0
        if mode == "on":  # what a product with the norm inside saves: the norm's own kernel
            norm_us = residual_norm_us(
                next(
                    m for m in model.modules() if isinstance(m, DecoderLayer)
                ).post_attention_layernorm
            )
            report["residual_norm_us"] = round(norm_us, 2)
            logger.info(
                "the residual add + RMSNorm at one row: %.2f us (what a product with the norm inside saves)",
                norm_us,
            )

        choices = _KernelChoices(mode, pdl, norm_us, report)
        for layer in model.modules():
            if isinstance(layer, DecoderLayer):
                _use_choices(layer, choices)
    torch.cuda.synchronize()
    return report


def place_norms(layer: nn.Module, in_gemv: bool) -> None:
    """Whether a decoder layer's two norms run inside its one-row qkv and gate_up products or
    as their own kernels; each way has its own measured plan of the one-row kernel (with the
    norm inside it may win while slower than cuBLAS by up to the norm kernel it removes), which
    ``enable_fused_kernels`` keeps in ``layer.gemv_plans``."""
    layer.norms_in_gemv = in_gemv
    if layer.gemv_plans is not None:
        layer.self_attn.qkv_proj.gemv_plan, layer.mlp.gemv_plan = layer.gemv_plans[in_gemv]


def enable_fused_all_reduce_norm(
    model: nn.Module,
    device: torch.device,
    hidden_size: int,
    on_phase: Callable[[str], None] | None = None,
) -> bool:
    """Under tensor parallelism on GPUs: each decoder layer's two row-parallel projections leave
    their all-reduce to the RMSNorm after them, which does all-reduce, residual add and norm in
    one kernel (distributed.FusedAllReduceNorm). Every rank calls this; False where it is off."""
    from ..distributed import set_up_fused_all_reduce_norm
    from ..models.transformer import DecoderLayer, DecoderModel

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
            module.post_attention_layernorm.takes_all_reduce = (
                module.self_attn.o_proj.all_reduce_buffer
            )
            module.mlp.down_proj.leaves_all_reduce = True
            module.input_layernorm.takes_all_reduce = module.mlp.down_proj.all_reduce_buffer
            place_norms(module, False)  # the norms are where the all-reduce happens now
        elif isinstance(module, DecoderModel):
            module.norm.takes_all_reduce = module.layers[-1].mlp.down_proj.all_reduce_buffer
    return True
