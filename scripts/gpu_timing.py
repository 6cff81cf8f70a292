"""Time of one call of a GPU function as the engine runs it: many calls captured in one CUDA
graph, replayed (the device scripts' shared timer: scripts/gpu_kernel_ab.py, scripts/gpu_decode_sweep.py)."""

from __future__ import annotations

import torch


def graph_us(fn, calls: int = 20, replays: int = 20) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return 1000 * start.elapsed_time(end) / (calls * replays)
