"""Where the time of a tensor-parallel decode step goes (issue 14: batch-1 decode with --tp 2
should take at most 0.7x the time per token of --tp 1). Run on a machine with two GPUs after the
kernels are built, through ``scripts/gpu_check.sh tpprofile``. For the qwen3-8b shape in bf16,
random weights, with --tp 1 (one process) and then --tp 2 (two processes, rank 0 prints):

1. GPU time of one CUDA-graph replay of a decode step at batch 1 and 8, and its kernels;
2. the host time of each stage of the scheduler's loop at batch 1 and the wall time per token;
   under --tp 2 also a Chrome trace of rank 0's steps ($OUT/trace_tp2.json.gz).

Set MINISGL_ALL_REDUCE=nccl to see the same with NCCL doing every all-reduce.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_profile  # noqa: E402  (the single-GPU profile's helpers)


def profile_rank(rank: int, tp: int, addr: str, shape: str) -> None:
    from minisgl_engine.distributed import init_tp, shutdown_tp

    logging.basicConfig(level=logging.WARNING, format=f"rank {rank} %(name)s: %(message)s")
    device = torch.device(f"cuda:{rank}")
    init_tp(rank, tp, f"tcp://{addr}", device, timeout_s=600)
    # every rank runs the same steps (their collectives must meet); rank 0 alone prints
    out = open(os.devnull, "w") if rank else contextlib.nullcontext(sys.stdout)
    with out as stream, contextlib.redirect_stdout(stream):
        label = f"{shape} tp {tp}"
        llm = gpu_profile.make_llm(
            config=shape,
            tp=tp,
            device=str(device),
            max_kv_tokens=50_000,
            max_running_requests=16,
            cuda_graph_max_bs=16,
        )
        gpu_profile.graph_replays(llm, [1, 8], ctx=512, label=label, profile_sizes=(1,))
        llm = None
        gpu_profile.cleanup()
        gpu_profile.host_stages(
            overlap=True,
            trace="trace_tp2.json" if tp > 1 and rank == 0 else None,
            config=shape,
            tp=tp,
            device=str(device),
        )
        gpu_profile.cleanup()
    shutdown_tp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="qwen3-8b", help="the model shape (random weights)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for tp in args.tp:
        print(f"\n######## --tp {tp}", flush=True)
        mp.start_processes(
            profile_rank,
            args=(tp, f"127.0.0.1:{free_port()}", args.config),
            nprocs=tp,
            join=True,
            start_method="spawn",
        )


if __name__ == "__main__":
    main()
