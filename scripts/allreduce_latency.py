"""How long one small all-reduce takes between two GPUs, the way a decode step does them: the
qwen3-8b shape does 72 of 8 KB (one token, hidden 4096, bf16) per token with --tp 2.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python scripts/allreduce_latency.py

Times, per all-reduce, eager and inside a CUDA graph of 72: NCCL (what the engine uses today)
and PyTorch's symmetric-memory one-shot all-reduce (peer-to-peer loads over NVLink, no
multicast), a candidate for the small messages of decode. Checks that both give the same sums.
Rank 0 prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN = 4096  # qwen3-8b
PER_TOKEN = 72  # two all-reduces per layer, 36 layers
REPEAT = 200


def timed(fn, repeat: int) -> float:
    """Microseconds per call of ``fn`` (GPU time between two events)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeat


def in_graph(op, x: torch.Tensor) -> float:
    """Microseconds per all-reduce when ``PER_TOKEN`` of them replay as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            op(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(PER_TOKEN):
            op(x)
    return timed(graph.replay, REPEAT // 4) / PER_TOKEN


def rank_main(rank: int, world: int, port: int) -> None:
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device
    )
    row: dict = {
        "bench": "allreduce",
        "gpus": world,
        "device": torch.cuda.get_device_name(device),
        "bytes": HIDDEN * 2,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    x = torch.randn(HIDDEN, dtype=torch.bfloat16, device=device) * 0.01

    def nccl(t: torch.Tensor) -> None:
        dist.all_reduce(t)

    row["nccl_eager_us"] = round(timed(lambda: nccl(x), REPEAT), 2)
    row["nccl_graph_us"] = round(in_graph(nccl, x), 2)
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        buf = symm_mem.empty(HIDDEN, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(buf, group)
        out = torch.empty_like(buf)

        def one_shot(t: torch.Tensor) -> None:
            torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group, out)

        ref = (
            torch.arange(HIDDEN, device=device, dtype=torch.float32).to(torch.bfloat16)
            * (rank + 1)
            / 1000
        )
        buf.copy_(ref)
        expected = ref.clone()
        dist.all_reduce(expected)
        torch.cuda.synchronize()
        dist.barrier()
        one_shot(buf)
        torch.cuda.synchronize()
        row["one_shot_matches_nccl"] = bool(torch.equal(out, expected))
        row["one_shot_eager_us"] = round(timed(lambda: one_shot(buf), REPEAT), 2)
        row["one_shot_graph_us"] = round(in_graph(one_shot, buf), 2)
    except Exception as exc:  # not in this build, or not on this machine: say why
        row["one_shot_error"] = (
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        )
    if rank == 0:
        row["per_token_ms_nccl_graph"] = round(row["nccl_graph_us"] * PER_TOKEN / 1000, 3)
        if "one_shot_graph_us" in row:
            row["per_token_ms_one_shot_graph"] = round(
                row["one_shot_graph_us"] * PER_TOKEN / 1000, 3
            )
        print(json.dumps(row), flush=True)
    sys.stdout.flush()
    os._exit(
        0
    )  # NCCL's teardown after graph capture can hang (pytorch#115388); nothing is left to do


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.start_processes(rank_main, args=(2, free), nprocs=2, join=True, start_method="spawn")
