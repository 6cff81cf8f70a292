"""Runs in each spawned tensor-parallel rank of tests/test_tensor_parallel.py (a module of its own
so that the child processes need not import pytest's test module)."""

from __future__ import annotations

from pathlib import Path

import torch


def run_rank(rank: int, world: int, port: int, jobs: list[tuple[str, str, list[list[int]]]], out: str) -> None:
    from minisgl_engine.distributed import init_tp, shutdown_tp
    from minisgl_engine.llm import LLM
    from minisgl_engine.sampling_params import SamplingParams

    torch.set_num_threads(1)  # two ranks share the machine's cores
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", torch.device("cpu"))
    results = {}
    for name, folder, prompts in jobs:
        llm = LLM(folder, device="cpu", tp=world, max_kv_tokens=4096, max_prefill_tokens=48, max_running_requests=8)
        outputs = [r.token_ids for r in llm.generate(prompts, SamplingParams(max_tokens=16))]
        logits = llm.score(prompts[0] + outputs[0], prefill_len=len(prompts[0]))
        results[name] = (outputs, logits)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    shutdown_tp()


def score_rank(rank: int, world: int, port: int, folder: str, seqs: list[list[int]], positions: int, out: str) -> None:
    """Teacher-forced logits of ``seqs`` from one rank of a --tp ``world`` GPU engine."""
    from minisgl_engine.distributed import init_tp, shutdown_tp
    from minisgl_engine.llm import LLM

    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    init_tp(rank, world, f"tcp://127.0.0.1:{port}", device)
    llm = LLM(folder, device=f"cuda:{rank}", dtype="bfloat16", tp=world, max_kv_tokens=40_000, max_running_requests=64,
              cuda_graph_max_bs=64)
    logits = llm.score_batch(seqs, [len(s) - positions for s in seqs])
    if rank == 0:
        torch.save(torch.cat([rows[-positions - 1 : -1].cpu() for rows in logits]), Path(out) / "tp_logits.pt")
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
