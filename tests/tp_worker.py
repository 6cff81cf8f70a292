"""Runs in each spawned tensor-parallel rank of tests/server/test_tensor_parallel.py (a module of its own
so that the child processes need not import pytest's test module)."""

from __future__ import annotations

from pathlib import Path

import torch


def run_rank(
    rank: int, world: int, port: int, jobs: list[tuple[str, str, list[list[int]]]], out: str
) -> None:
    from minisgl_engine.distributed import init_tp, shutdown_tp
    from minisgl_engine.llm import LLM
    from minisgl_engine.sampling_params import SamplingParams

    torch.set_num_threads(1)  # two ranks share the machine's cores
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", torch.device("cpu"))
    results = {}
    for name, folder, prompts in jobs:
        llm = LLM(
            folder,
            device="cpu",
            tp=world,
            max_kv_tokens=4096,
            max_prefill_tokens=48,
            max_running_requests=8,
        )
        outputs = [r.token_ids for r in llm.generate(prompts, SamplingParams(max_tokens=16))]
        logits = llm.score(prompts[0] + outputs[0], prefill_len=len(prompts[0]))
        results[name] = (outputs, logits)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    shutdown_tp()


def score_rank(
    rank: int, world: int, port: int, folder: str, seqs: list[list[int]], positions: int, out: str
) -> None:
    """Teacher-forced logits of ``seqs`` from one rank of a --tp ``world`` GPU engine."""
    from minisgl_engine.distributed import init_tp, shutdown_tp
    from minisgl_engine.llm import LLM

    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", device)
    llm = LLM(
        folder,
        device=f"cuda:{rank}",
        dtype="bfloat16",
        tp=world,
        max_kv_tokens=40_000,
        max_running_requests=64,
        cuda_graph_max_bs=64,
    )
    logits = llm.score_batch(seqs, [len(s) - positions for s in seqs])
    if rank == 0:
        torch.save(
            torch.cat([rows[-positions - 1 : -1].cpu() for rows in logits]),
            Path(out) / "tp_logits.pt",
        )
    shutdown_tp()


def leave_rank(rank: int, world: int, port: int, out: str) -> None:
    """Rank 0 shuts down while rank 1 never does (stuck, or dead): rank 0 must still exit, and
    soon. Rank 1 writes when it is in place, then sleeps until the test kills it."""
    import time

    from minisgl_engine.distributed import init_tp, shutdown_tp

    init_tp(rank, world, f"tcp://127.0.0.1:{port}", torch.device("cpu"), timeout_s=60)
    if rank == 1:
        time.sleep(600)
    start = time.monotonic()
    shutdown_tp(timeout_s=2.0)
    Path(out, "rank0_left").write_text(f"{time.monotonic() - start:.2f}")  # not reached: it exits


def all_reduce_rank(rank: int, world: int, port: int, out: str) -> None:
    """distributed.all_reduce on GPUs against NCCL's own sum, eager and replayed from a CUDA
    graph, small (one-shot) and large (NCCL) tensors; rank 0 writes what it found."""
    import json

    from minisgl_engine import distributed
    from minisgl_engine.distributed import all_reduce, init_tp, shutdown_tp

    device = torch.device(f"cuda:{rank}")
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", device)
    found: dict = {"one_shot": distributed._one_shot is not None}
    gen = torch.Generator(device=device).manual_seed(rank)

    def sample(rows: int) -> torch.Tensor:
        return torch.randn(rows, 4096, generator=gen, device=device).to(torch.bfloat16)

    def same(a: torch.Tensor, b: torch.Tensor) -> str:
        """ "exact", "rounding" (within bf16's rounding of a sum) or the largest difference."""
        if torch.equal(a, b):
            return "exact"
        return (
            "rounding"
            if torch.allclose(a.float(), b.float(), rtol=2e-2, atol=1e-2)
            else f"off by {(a - b).abs().max().item()}"
        )

    def nccl_sum(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        torch.distributed.all_reduce(y)
        return y

    for rows in (1, 8, 128, 300):  # 128 rows = 1 MiB, the one-shot limit; 300 go through NCCL
        for buffer in (0, 1):
            x = sample(rows)
            found[f"eager_{rows}_{buffer}"] = same(all_reduce(x.clone(), buffer), nccl_sum(x))
    # a decode step's pattern inside a CUDA graph: alternate buffers, each result feeding the next
    inputs = [sample(4) for _ in range(6)]
    static = [x.clone() for x in inputs]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        h = static[0]
        for i in range(1, 6):
            h = all_reduce(h + static[i], i % 2)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h = static[0]
        for i in range(1, 6):
            h = all_reduce(h + static[i], i % 2)
    graph_out = h
    for step in range(3):
        fresh = [sample(4) for _ in range(6)]
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        ref = fresh[0]
        for i in range(1, 6):
            ref = nccl_sum(ref + fresh[i])
        found[f"graph_replay_{step}"] = same(graph_out, ref)
    torch.cuda.synchronize()
    if rank == 0:
        Path(out, "all_reduce.json").write_text(json.dumps(found))
    shutdown_tp()


def fused_norm_rank(rank: int, world: int, port: int, out: str, hidden: int) -> None:
    """The fused all-reduce + residual add + RMSNorm kernel against what it replaces (NCCL's sum,
    then FlashInfer's add + norm), eager at several batch sizes and chained in a CUDA graph the
    way decoder layers call it; rank 0 writes what it found."""
    import json

    import flashinfer

    from minisgl_engine import distributed
    from minisgl_engine.distributed import init_tp, shutdown_tp

    device = torch.device(f"cuda:{rank}")
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", device)
    found: dict = {"fused": distributed.set_up_fused_all_reduce_norm(device, hidden)}
    fused = distributed.fused_all_reduce_norm()
    gen = torch.Generator(device=device).manual_seed(rank)
    weight = (
        1
        + 0.1
        * torch.randn(
            hidden, generator=torch.Generator(device=device).manual_seed(7), device=device
        )
    ).to(torch.bfloat16)

    def sample(rows: int) -> torch.Tensor:
        return torch.randn(rows, hidden, generator=gen, device=device).to(torch.bfloat16)

    def unfused(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = x.clone(), residual.clone()
        torch.distributed.all_reduce(x)
        flashinfer.norm.fused_add_rmsnorm(x, residual, weight, 1e-6)
        return x, residual

    def same(a: torch.Tensor, b: torch.Tensor) -> str:
        if torch.equal(a, b):
            return "exact"
        return (
            "rounding"
            if torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)
            else f"off by {(a - b).abs().max().item()}"
        )

    if fused is not None:
        for rows in (1, 5, 64, 128):
            x, residual = sample(rows), sample(rows)
            (normed, summed), (ref_normed, ref_summed) = (
                fused(x, residual, weight, 1e-6),
                unfused(x, residual),
            )
            found[f"eager_{rows}"] = same(normed, ref_normed)
            found[f"eager_{rows}_residual"] = same(summed, ref_summed)
        # decode's pattern: each layer's input depends on the last norm's output
        static = [sample(4) for _ in range(7)]

        def chain(step) -> torch.Tensor:
            normed, residual = static[0], static[0]
            for x in static[1:]:
                normed, residual = step(x + 0.5 * normed, residual)
            return normed

        def fused_step(x, residual):
            return fused(x, residual, weight, 1e-6)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain(fused_step)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = chain(fused_step)
        for step in range(3):
            for s in static:
                s.copy_(sample(4))
            graph.replay()
            found[f"graph_replay_{step}"] = same(graph_out, chain(unfused))
    torch.cuda.synchronize()
    if rank == 0:
        Path(out, f"fused_norm_{hidden}.json").write_text(json.dumps(found))
    shutdown_tp()
