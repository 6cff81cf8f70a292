"""Where the time of a step goes on a GPU (run on the device machine after the kernels are built,
through ``scripts/gpu_check.sh profile``). Prints, for a Qwen3-0.6B-shape model in bf16:

1. GPU time of one CUDA-graph replay (a whole decode forward) per batch size, and the kernels
   inside it (torch profiler);
2. the kernels and CPU ops of one eager decode step (what the graph saves);
3. the host time of each stage of the scheduler's loop at batch 1, overlap on and off, and a
   cProfile of that loop;
4. nano-vllm's offline workload split into prefill and decode steps (GPU time from CUDA events
   around each step, host time from the wall clock), for two prefill budgets; decode steps in
   buckets of 32 requests, each against its own floor (its weights and the K/V it attends to,
   read once at the measured copy bandwidth): where the workload is far from its floor;
5. (``--offline``) the GPU's idle time inside windows of that workload's decode steps (a kernel
   trace), and each decode attention's K/V bandwidth in the engine's graphs; with
   ``--offline-kernels`` the costliest kernels of each window and of the first prefill steps.

With ``host_stages(trace=NAME)`` a Chrome trace of a few batch-1 steps goes to $OUT/NAME.gz.
"""

from __future__ import annotations

import collections
import contextlib
import cProfile
import gc
import gzip
import io
import json
import logging
import os
import pstats
import shutil
import time
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl_engine.benchmarks.common import random_prompts
from minisgl_engine.benchmarks.offline_bench import copy_bandwidth, offline_workload
from minisgl_engine.config import EngineConfig
from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams

OUT = os.environ.get("OUT", "/tmp/gpu-check")


def make_llm(**overrides) -> LLM:
    base = dict(
        dummy_weights=True,
        config="qwen3-0.6b",
        device="cuda",
        dtype="bfloat16",
        max_kv_tokens=400_000,
        max_running_requests=256,
    )
    return LLM(config=EngineConfig(**{**base, **overrides}))


def self_gpu_us(evt) -> float:
    """A profiler row's own GPU time (the attribute's name changed between torch versions)."""
    t = getattr(evt, "self_device_time_total", None)
    return getattr(evt, "self_cuda_time_total", 0) if t is None else t


def kernel_table(prof, steps: int, limit: int = 30) -> None:
    rows = []
    for evt in prof.key_averages():
        t = self_gpu_us(evt)
        if t > 0:
            rows.append((t, evt.count, evt.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(
        f"  GPU time per step {total / steps:.1f} us in {sum(r[1] for r in rows) / steps:.0f} kernels/copies"
    )
    for t, n, key in rows[:limit]:
        print(f"  {t / steps:9.1f} us  {n / steps:6.1f}x  {key[:110]}")


def kernel_sequence(graph, first: int) -> None:
    """The kernels of one replay in launch order with their times and the idle gap before each:
    what a layer's kernels cost one by one (the table above lumps a kernel's shapes together)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    if not kernels:
        return
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    print(f"  one replay: {len(kernels)} kernels, {busy:.1f} us busy in a {span:.1f} us span")
    previous_end = kernels[0].time_range.start
    for e in kernels[:first]:
        print(
            f"  {e.time_range.elapsed_us():7.1f} us (gap {e.time_range.start - previous_end:5.1f})  {e.name[:100]}"
        )
        previous_end = e.time_range.end
    print(
        f"  ... last kernel: {kernels[-1].time_range.elapsed_us():.1f} us {kernels[-1].name[:100]}"
    )


def decode_until(llm: LLM, bs: int, ctx: int, steps: int):
    """Start ``bs`` requests and run until ``steps`` decode steps of them are done; returns
    the suspended stream (close it to abort them)."""
    vocab = llm.engine.model_config.vocab_size
    stream = llm.stream(
        random_prompts(bs, ctx, vocab, seed=bs), SamplingParams(max_tokens=4096, ignore_eos=True)
    )
    got = 0
    for _ in stream:
        got += 1
        if got >= bs * steps:
            break
    return stream


def graph_replays(
    llm: LLM, sizes: list[int], ctx: int, label: str, profile_sizes=(1, 256), sequence: int = 0
) -> None:
    print(f"\n== 1. [{label}] CUDA-graph replay of a decode step, context {ctx} tokens per request")
    runner = llm.engine.graph_runner
    for bs in sizes:
        stream = decode_until(llm, bs, ctx, 4)
        size, kind = runner.last_graph  # the graph the engine replayed for these requests
        assert size == runner.size_for(bs), (size, bs)
        graph = runner.graphs[size, kind]
        torch.cuda.synchronize()
        for _ in range(5):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 50
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / n
        print(
            f"[{label}] bs {bs:4d} (graph {size}, {kind} attention): {ms * 1000:8.1f} us per replay"
        )
        if bs in profile_sizes:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    graph.replay()
                torch.cuda.synchronize()
            kernel_table(prof, 10)
            if sequence:
                kernel_sequence(graph, sequence)
        stream.close()


def profile_steps(llm: LLM, steps: int):
    """CPU and GPU profile of ``steps`` batch-1 decode steps (after a few unprofiled ones)."""
    stream = decode_until(llm, 1, 128, 4)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            next(stream)
        torch.cuda.synchronize()
    stream.close()
    return prof


def eager_step(llm: LLM) -> None:
    print("\n== 2. one eager decode step at batch 1 (CUDA graphs off), CPU and GPU")
    runner, llm.engine.graph_runner = llm.engine.graph_runner, None
    prof = profile_steps(llm, 10)
    llm.engine.graph_runner = runner
    kernel_table(prof, 10, limit=25)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


class Timers:
    """Inclusive wall time of wrapped callables."""

    def __init__(self) -> None:
        self.total: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)

    def wrap(self, owner, name: str, label: str | None = None) -> None:
        fn = getattr(owner, name, None)
        if fn is None:  # the engine changed: time what still exists
            print(f"  (no {type(owner).__name__}.{name} to time)")
            return
        label = label or name

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] += time.perf_counter() - start
                self.calls[label] += 1

        setattr(owner, name, timed)

    def report(self, steps: int) -> None:
        for label, t in sorted(self.total.items(), key=lambda kv: -kv[1]):
            print(
                f"  {label:28s} {1e6 * t / steps:8.1f} us/step ({self.calls[label] / steps:.1f} calls)"
            )


def host_stages(overlap: bool, trace: str | None = None, **overrides) -> None:
    """Host time per stage of batch-1 decode (``overrides``: other EngineConfig fields, such as
    another model shape); ``trace`` names a Chrome trace of a few steps to write under $OUT."""
    print(
        f"\n== 3. host time per stage, batch 1, 128 in, overlap {'on' if overlap else 'off'} {overrides or ''}"
    )
    llm = make_llm(
        **{
            **dict(
                overlap=overlap, max_kv_tokens=20_000, max_running_requests=16, cuda_graph_max_bs=16
            ),
            **overrides,
        }
    )
    eng, sched = llm.engine, llm.scheduler
    timers = Timers()
    for name in ("schedule", "launch", "collect", "_grow_decode_pages"):
        timers.wrap(sched, name)
    for name in ("forward_batch", "prepare", "_forward"):
        timers.wrap(eng, name)
    timers.wrap(eng.attn_backend, "prepare", "attn.prepare")
    timers.wrap(eng.attn_backend, "kv_layout", "attn.kv_layout")
    timers.wrap(eng.graph_runner, "replay", "graph.replay")
    timers.wrap(eng.sampler, "sample", "sampler.sample")
    timers.wrap(eng.page_table, "flush", "page_table.flush")
    for wrapper in eng.attn_backend.graph_wrappers.values():
        timers.wrap(wrapper, "plan", "flashinfer.plan")
    import minisgl_engine.engine as engine_module

    original_tokens = engine_module.StepResult.tokens

    def tokens(self):
        start = time.perf_counter()
        try:
            return original_tokens(self)
        finally:
            timers.total["StepResult.tokens (wait)"] += time.perf_counter() - start
            timers.calls["StepResult.tokens (wait)"] += 1

    engine_module.StepResult.tokens = tokens
    vocab = eng.model_config.vocab_size
    params = SamplingParams(max_tokens=256, ignore_eos=True)
    llm.generate([random_prompts(1, 128, vocab, seed=1)[0]], params)  # warm-up
    timers.total.clear()
    timers.calls.clear()
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([random_prompts(1, 128, vocab, seed=2)[0]], params)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    print(
        f"  wall {wall * 1000:.1f} ms for 256 tokens: {wall / 256 * 1e6:.1f} us/token, {256 / wall:.1f} tok/s"
    )
    timers.report(256)
    engine_module.StepResult.tokens = original_tokens
    prof = cProfile.Profile()
    prof.enable()
    llm.generate([random_prompts(1, 128, vocab, seed=3)[0]], params)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print("\n".join(text.getvalue().splitlines()[:60]))
    if trace:
        p = profile_steps(llm, 6)
        path = os.path.join(OUT, trace)
        p.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(path)


def offline_engine(max_prefill_tokens: int) -> tuple[LLM, list[list[int]], list[SamplingParams]]:
    """An engine for nano-vllm's offline workload (256 requests, as ``bench offline``), warmed by
    one short request, with the workload's prompts and each request's sampling."""
    llm = make_llm(max_prefill_tokens=max_prefill_tokens)
    prompts, output_lens = offline_workload(256, 1024, 1024, llm.engine.model_config.vocab_size)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in output_lens]
    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=8, ignore_eos=True))
    return llm, prompts, params


def offline_split(max_prefill_tokens: int) -> None:
    print(f"\n== 4. offline workload, --max-prefill-tokens {max_prefill_tokens}")
    llm, prompts, params = offline_engine(max_prefill_tokens)
    eng = llm.engine
    output_lens = [p.max_tokens for p in params]
    records = []
    forward = eng.forward_batch

    def timed_forward(batch, *args, **kwargs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # the tokens whose K/V the step's attention reads (read before the step moves cached_len)
        kv_tokens = sum(req.cached_len + n for req, n in zip(batch.reqs, batch.extend_lens))
        t0 = time.perf_counter()
        start.record()
        result = forward(batch, *args, **kwargs)
        end.record()
        records.append(
            (
                batch.phase,
                batch.size,
                batch.num_tokens,
                start,
                end,
                time.perf_counter() - t0,
                kv_tokens,
            )
        )
        return result

    eng.forward_batch = timed_forward
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    eng.forward_batch = forward
    llm.scheduler.drain()
    out_tokens = sum(output_lens)
    print(f"  wall {wall:.2f} s, {out_tokens / wall:.0f} output tok/s, {len(records)} steps")
    # against each step's own floor: its weights and the K/V it attends to, read once at the copy bandwidth
    from minisgl_engine.kvcache import KVPool
    from minisgl_engine.model_loader import param_bytes

    mc = eng.model_config
    kv_per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, eng.kv_dtype)
    weights, bandwidth = param_bytes(mc, eng.dtype), copy_bandwidth(eng.device)
    groups: dict[str, list] = collections.defaultdict(list)
    for phase, bs, ntok, s, e, host, kv_tokens in records:
        top = min(256, ((bs - 1) // 32 + 1) * 32)
        key = phase if phase == "prefill" else f"decode bs {top - 31:3d}-{top}"
        groups[key].append((s.elapsed_time(e), host, ntok, bs, kv_tokens))
    gpu_total = 0.0
    for key in sorted(
        groups,
        key=lambda k: (k == "prefill", int(k.split()[2].split("-")[0]) if k != "prefill" else 0),
    ):
        rows = groups[key]
        gpu = sum(r[0] for r in rows)
        gpu_total += gpu
        host = sum(r[1] for r in rows)
        kv = sum(r[4] for r in rows)
        floor_ms = 1000 * (len(rows) * weights + kv * kv_per_token) / bandwidth
        print(
            f"  {key:18s} {len(rows):5d} steps  GPU {gpu / 1000:6.2f} s ({gpu / len(rows):6.2f} ms/step)  "
            f"host in forward_batch {host:6.2f} s ({1000 * host / len(rows):6.2f} ms/step)  tokens {sum(r[2] for r in rows)}  "
            f"K/V read {kv * kv_per_token / 1e9:6.1f} GB, context {kv / sum(r[3] for r in rows):6.0f} per request  "
            f"floor {floor_ms / 1000:5.2f} s ({100 * floor_ms / gpu:3.0f}% reached)"
        )
    print(
        f"  GPU busy in steps {gpu_total / 1000:.2f} s of {wall:.2f} s wall ({100 * gpu_total / 1000 / wall:.0f}%)"
    )
    llm = None
    cleanup()


def busy_and_span(prof) -> tuple[float, float, int]:
    """GPU time covered by at least one kernel or copy, the span from the first one's start to
    the last one's end (both us), and how many there were: the rest of the span the GPU idled."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return 0.0, 0.0, 0
    busy, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    return busy, max(e for _, e in spans) - spans[0][0], len(spans)


def generate_through(llm: LLM, forward_batch, prompts, params) -> float:
    """Run the workload with ``forward_batch`` in place of the engine's (then put back): its wall seconds."""
    eng = llm.engine
    forward, eng.forward_batch = eng.forward_batch, forward_batch
    try:
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    finally:
        eng.forward_batch = forward


def offline_idle(max_prefill_tokens: int = 8192, window: int = 20, kernels: int = 0) -> None:
    """The offline workload run as the bench runs it, with a kernel trace (GPU activity only:
    the CPU's timing stays as it is) over ``window`` decode steps once the batch first falls to
    each of 256, 192, 128, 64 and 16 requests: how much of those steps' time the GPU idled,
    waiting for the CPU. Events around each step (offline_split) cannot tell that wait apart.
    With ``kernels``, also each window's ``kernels`` costliest kernels per step (the sampler's
    and the products' beside attention), and a window over the workload's first prefill steps."""
    print(f"\n== 5. offline workload, GPU idle time inside windows of {window} decode steps")
    llm, prompts, params = offline_engine(max_prefill_tokens)
    eng = llm.engine
    targets = [256, 192, 128, 64, 16]
    state = {
        "prof": None,
        "steps": 0,
        "sizes": [],
        "t0": 0.0,
        "phase": "decode",
        "prefill_traced": not kernels,
    }
    forward = eng.forward_batch

    def start(phase: str) -> None:
        state.update(
            prof=profile(activities=[ProfilerActivity.CUDA]),
            steps=0,
            sizes=[],
            t0=time.perf_counter(),
            phase=phase,
        )
        state["prof"].start()

    def traced_forward(batch, *args, **kwargs):
        if state["prof"] is None:
            if batch.phase == "prefill" and not state["prefill_traced"]:
                state["prefill_traced"] = True
                start("prefill")
            elif targets and batch.phase == "decode" and batch.size <= targets[0]:
                while targets and batch.size <= targets[0]:
                    targets.pop(0)
                start("decode")
        result = forward(batch, *args, **kwargs)
        if state["prof"] is not None and batch.phase == state["phase"]:
            state["steps"] += 1
            state["sizes"].append(batch.num_tokens if batch.phase == "prefill" else batch.size)
            steps = 4 if batch.phase == "prefill" else window
            if state["steps"] == steps:
                prof, state["prof"] = state["prof"], None
                prof.stop()
                wall = time.perf_counter() - state["t0"]
                busy, span, count = busy_and_span(prof)
                sizes = state["sizes"]
                what = (
                    f"prefill of {sum(sizes)} tokens"
                    if batch.phase == "prefill"
                    else f"decode batch {max(sizes):3d}-{min(sizes):3d}"
                )
                print(
                    f"  {what}: {steps} steps, GPU span {span / steps / 1000:6.2f} ms/step, "
                    f"busy {busy / steps / 1000:6.2f} ms/step ({100 * busy / span:3.0f}%), {count / steps:.0f} kernels/step; "
                    f"CPU wall {1000 * wall / steps:6.2f} ms/step (with the tracer's stop)",
                    flush=True,
                )
                if kernels:
                    kernel_table(prof, steps, limit=kernels)
        return result

    print(
        f"  wall {generate_through(llm, traced_forward, prompts, params):.2f} s (with the traces)"
    )
    llm.scheduler.drain()
    llm = None
    cleanup()


def offline_prefill_host(max_prefill_tokens: int = 8192, with_cprofile: bool = False) -> None:
    """Round 13 found the offline workload's prefill steps 61% busy on the GPU: per prefill step,
    the host's time inside forward_batch, the wall time since the previous step began, and the
    GPU time (CUDA events), the prefill phase's wall time (first prefill step to first decode
    step); ``with_cprofile``: a cProfile of the host over the prefill phase too (first step apart:
    it meets the 8,192-token shapes first), which slows the host it measures."""
    print(
        f"\n== 6. offline workload, host side of the prefill steps (--max-prefill-tokens {max_prefill_tokens})"
    )
    llm, prompts, params = offline_engine(max_prefill_tokens)
    eng = llm.engine
    forward = eng.forward_batch
    records: list = []
    profiles = {"first": cProfile.Profile(), "rest": cProfile.Profile()}
    state = {"prev": None, "active": None, "done": False, "first": None, "phase_end": None}

    def traced_forward(batch, *args, **kwargs):
        now = time.perf_counter()
        if state["done"]:
            return forward(batch, *args, **kwargs)
        if batch.phase != "prefill":
            if state["active"] is not None:
                state["active"].disable()
            state["done"], state["phase_end"] = True, now
            return forward(batch, *args, **kwargs)
        if state["first"] is None:
            state["first"] = now
        if not with_cprofile:
            pass
        elif state["active"] is None:
            state["active"] = profiles["first"]
            state["active"].enable()
        elif state["active"] is profiles["first"]:
            profiles["first"].disable()
            state["active"] = profiles["rest"]
            state["active"].enable()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = forward(batch, *args, **kwargs)
        end.record()
        records.append(
            (
                batch.num_tokens,
                batch.size,
                now - state["prev"] if state["prev"] else 0.0,
                time.perf_counter() - now,
                start,
                end,
            )
        )
        state["prev"] = now
        return result

    print(f"  wall {generate_through(llm, traced_forward, prompts, params):.2f} s")
    for i, (ntok, bs, since, host, s, e) in enumerate(records):
        print(
            f"  prefill step {i:2d}: {ntok:5d} tokens of {bs:3d} requests  since previous {1000 * since:7.2f} ms  "
            f"host in forward_batch {1000 * host:6.2f} ms  GPU {s.elapsed_time(e):6.2f} ms"
        )
    rest = records[1:]
    print(
        f"  prefill phase: {len(records)} steps in {1000 * (state['phase_end'] - state['first']):.1f} ms (first prefill step to "
        f"first decode step); steps after the first: host in forward_batch {1000 * sum(r[3] for r in rest) / len(rest):.2f} ms, "
        f"GPU {sum(r[4].elapsed_time(r[5]) for r in rest) / len(rest):.2f} ms, apart {1000 * sum(r[2] for r in rest) / len(rest):.2f} ms a step"
    )
    for name, prof in profiles.items() if with_cprofile else ():
        text = io.StringIO()
        print(f"  -- cProfile, {name} prefill step(s), by own time")
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print("\n".join(text.getvalue().splitlines()[:45]))
        text = io.StringIO()
        print(f"  -- cProfile, {name} prefill step(s), by cumulative time")
        pstats.Stats(prof, stream=text).sort_stats("cumtime").print_stats(30)
        print("\n".join(text.getvalue().splitlines()[:50]))
    llm.scheduler.drain()
    llm = None
    cleanup()


def cleanup() -> None:
    """Free the GPU memory of engines no longer referenced (they hold reference cycles)."""
    gc.collect()
    torch.cuda.empty_cache()


def replays(
    sizes: list[int], ctx: int, label: str, profile_sizes=(), sequence: int = 0, **overrides
) -> None:
    """:func:`graph_replays` on an engine of its own (``overrides``: EngineConfig fields), freed after."""
    llm = make_llm(**overrides)
    graph_replays(llm, sizes, ctx=ctx, label=label, profile_sizes=profile_sizes, sequence=sequence)
    llm = None
    cleanup()


@contextlib.contextmanager
def tensor_core_decode():
    """Engines made inside decode on FlashInfer's tensor-core kernel whatever the head counts."""
    import minisgl_engine.attention.flashinfer_backend as backend

    rule = backend.decode_uses_tensor_cores
    backend.decode_uses_tensor_cores = lambda *args: True
    try:
        yield
    finally:
        backend.decode_uses_tensor_cores = rule


ATTENTION_KERNELS = (
    "BatchDecode",
    "BatchPrefill",
    "MergeStates",
    "merge_state",
    "_decode_attention",
)


def attention_bandwidth(sizes: list[int], ctx: int, label: str, **overrides) -> None:
    """Each batch size's decode step in its CUDA graph: the GPU time of the whole replay and of
    its attention kernels, and the K/V bytes per second those read (the offline workload's
    floor is mostly K/V: which attention reads it fastest at its batch sizes)."""
    from minisgl_engine.kvcache import KVPool

    llm = make_llm(**overrides)
    mc, runner = llm.engine.model_config, llm.engine.graph_runner
    kv_per_token = KVPool.bytes_per_token(
        mc.num_layers, mc.num_kv_heads, mc.head_dim, llm.engine.kv_dtype
    )
    for bs in sizes:
        stream = decode_until(llm, bs, ctx, 4)
        size, kind = runner.last_graph
        graph = runner.graphs[size, kind]
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        steps = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                graph.replay()
            torch.cuda.synchronize()
        total = attention = 0.0
        names = set()
        for evt in prof.key_averages():
            t = self_gpu_us(evt)
            total += t
            if any(k in evt.key for k in ATTENTION_KERNELS):
                attention += t
                names.add(evt.key[:40])
        total, attention = total / steps, attention / steps
        kv_bytes = bs * (ctx + 5) * kv_per_token  # the prompt, the decoded tokens and this step's
        print(
            f"[{label}] bs {bs:4d} ctx {ctx:5d} ({kind} graph {size}): step {total:7.1f} us, attention {attention:7.1f} us "
            f"= {kv_bytes / attention / 1e6:5.2f} TB/s of K/V, the rest {total - attention:6.1f} us  {sorted(names)}"
        )
        stream.close()
    llm = None
    cleanup()


def offline_levers() -> None:
    """Goal 2 (the offline workload): its steps against their floors, then the decode attention
    of its batch sizes on FlashInfer (CUDA cores, tensor cores) and on the Triton kernels."""
    offline_split(8192)
    offline_idle(8192)
    sizes, ctx = [16, 64, 128, 256], 1024  # the workload's mean context is about 1,000 tokens
    attention_bandwidth(sizes, ctx, "flashinfer", max_kv_tokens=300_000)
    with mock.patch.dict(
        os.environ, MINISGL_DECODE_ATTENTION="triton"
    ):  # read when an engine starts
        attention_bandwidth(sizes, ctx, "triton", max_kv_tokens=300_000)
    with tensor_core_decode():
        attention_bandwidth(sizes, ctx, "flashinfer tensor cores", max_kv_tokens=300_000)


def step_8b(quantizations: tuple[str, ...] = ("none",), sequence: int = 24) -> None:
    """The 8B shape's batch-1 decode step, kernel by kernel, under each ``--quantization``."""
    for quantization in quantizations:
        replays(
            [1],
            128,
            f"8b {quantization}",
            profile_sizes=(1,),
            sequence=sequence,
            config="qwen3-8b",
            max_kv_tokens=20_000,
            max_running_requests=16,
            cuda_graph_max_bs=16,
            quantization=quantization,
        )


def step_06b() -> None:
    """The 0.6B shape's batch-1 decode step, kernel by kernel, at 128 and 2,048 tokens of context."""
    for ctx in (128, 2048):
        replays(
            [1],
            ctx,
            f"0.6b ctx {ctx}",
            profile_sizes=(1,),
            sequence=16,
            max_kv_tokens=20_000,
            max_running_requests=16,
            cuda_graph_max_bs=16,
        )


def throughput() -> None:
    """The large batches of the offline workload and the 8B shape's batch-1 step."""
    replays(
        [64, 128, 256], 512, "0.6b", profile_sizes=(64, 256), sequence=16, max_kv_tokens=300_000
    )
    replays([256], 1024, "0.6b", max_kv_tokens=300_000)
    offline_split(8192)
    with tensor_core_decode():
        replays(
            [64, 256], 512, "0.6b tensor-core decode", profile_sizes=(256,), max_kv_tokens=300_000
        )
    step_8b()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the default configuration only: graph replays and host stages",
    )
    parser.add_argument(
        "--throughput",
        action="store_true",
        help="what issue 18's open goals need: large-batch replays, the offline split, the 8B's batch-1 step",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="goal 2: the offline workload's steps against their floors, and each decode attention's K/V bandwidth",
    )
    parser.add_argument(
        "--offline-kernels",
        action="store_true",
        help="goal 2: the offline workload's prefill and decode windows kernel by kernel (the sampler's included)",
    )
    parser.add_argument(
        "--prefill-host",
        action="store_true",
        help="goal 2: the host side of the offline workload's prefill steps (per-step times)",
    )
    parser.add_argument(
        "--prefill-host-cprofile",
        action="store_true",
        help="--prefill-host with a cProfile of the prefill phase",
    )
    parser.add_argument("--step-8b", action="store_true", help="the 8B shape's batch-1 step alone")
    parser.add_argument(
        "--quantizations",
        nargs="+",
        default=["none"],
        help="with --step-8b: the --quantization of each engine profiled in turn (none fp8 int4 ...)",
    )
    parser.add_argument(
        "--sequence", type=int, default=24, help="with --step-8b: kernels listed in launch order"
    )
    parser.add_argument(
        "--step-06b",
        action="store_true",
        help="the 0.6B shape's batch-1 step alone (128 and 2,048 tokens)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.step_8b or args.step_06b:
        step_8b(tuple(args.quantizations), args.sequence) if args.step_8b else step_06b()
        return
    if args.throughput:
        throughput()
        return
    if args.offline:
        offline_levers()
        return
    if args.prefill_host or args.prefill_host_cprofile:
        offline_prefill_host(with_cprofile=args.prefill_host_cprofile)
        return
    if args.offline_kernels:
        offline_idle(8192, window=10, kernels=30)
        return
    llm = make_llm(max_kv_tokens=150_000)
    print("fused kernels:", json.dumps(llm.engine.fused_kernels))
    print("decode on tensor cores:", llm.engine.attn_backend.decode_tensor_cores)
    graph_replays(llm, [1, 8, 64, 256], ctx=512, label="default")
    if not args.quick:
        eager_step(llm)
    llm = None
    cleanup()
    if not args.quick:
        replays(
            [1, 8, 64, 256], 512, "no fused kernels", max_kv_tokens=150_000, fused_kernels=False
        )
        with tensor_core_decode():
            replays(
                [1, 8, 64, 256],
                512,
                "tensor-core decode",
                profile_sizes=(256,),
                max_kv_tokens=150_000,
            )
    host_stages(overlap=True)
    cleanup()
    if not args.quick:
        for budget in (2048, 8192):
            offline_split(budget)


if __name__ == "__main__":
    main()
