"""``bench decode --compare-llamacpp``: our engine and llama.cpp on the same GGUF file, side by side.

A laptop user's alternative to this app is llama.cpp (under Ollama or LM Studio), so that is the
peer on CPU. Each run is a fresh process per engine (so each reports its own resident memory),
the two alternating, on the same prompt tokens with the same thread count; the prompts are
random token ids and every reply runs its full length (no end-of-text stop). llama.cpp comes from
llama-cpp-python, an optional install (``pip install -e '.[bench]'``); the engine never needs it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from dataclasses import replace
from pathlib import Path

from ..config import EngineConfig
from ..errors import UserError


def _memory_mb() -> tuple[float, float]:
    """(resident now, peak resident) of this process in MB, from /proc."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value
    as_mb = lambda key: round(int(fields[key].split()[0]) / 1024, 1)  # noqa: E731
    return as_mb("VmRSS"), as_mb("VmHWM")


def _row(
    engine: str, input_len: int, output_len: int, threads: int, ttft: float, decode_s: float
) -> dict:
    rss, peak = _memory_mb()
    return {
        "engine": engine,
        "input_len": input_len,
        "output_len": output_len,
        "threads": threads,
        "decode_tok_s": round((output_len - 1) / decode_s, 2),
        "ttft_ms": round(ttft * 1000, 1),
        "rss_mb": rss,
        "peak_rss_mb": peak,
    }


def _ours(
    config: EngineConfig, prompts: list[list[int]], output_len: int, threads: int, results
) -> None:
    """Our engine in this (child) process: TTFT, then the decode rate of the remaining tokens."""
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    llm = LLM(config=config)
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    for prompt in prompts[:1]:  # warm-up: first-call costs are not what we measure
        list(llm.stream([prompt[:32]], replace(params, max_tokens=4)))
    for prompt in prompts[1:]:
        start = time.perf_counter()
        first = None
        for _ in llm.stream([prompt], params):
            first = first or time.perf_counter()
        end = time.perf_counter()
        results.put(
            _row("minisgl-chat", len(prompt), output_len, threads, first - start, end - first)
        )
    quantization = getattr(llm.engine, "quantization", None)
    results.put(
        {
            "engine": "minisgl-chat",
            "quantization": quantization,
            "native_decode": llm.engine.native_decode,
        }
    )


def _llamacpp(
    gguf: str, prompts: list[list[int]], output_len: int, threads: int, n_ctx: int, results
) -> None:
    """llama.cpp through llama-cpp-python: the prompt in one eval, then one token at a time."""
    import llama_cpp
    from llama_cpp import Llama

    model = Llama(
        model_path=gguf,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=n_ctx,
        n_batch=512,
        verbose=False,
    )
    warm = prompts[0][:32]
    model.reset()
    model.eval(warm)
    for prompt in prompts[1:]:
        model.reset()
        start = time.perf_counter()
        model.eval(prompt)
        token = model.sample(top_k=1, temp=0)
        first = time.perf_counter()
        for _ in range(output_len - 1):
            model.eval([token])
            token = model.sample(top_k=1, temp=0)
        end = time.perf_counter()
        results.put(_row("llama.cpp", len(prompt), output_len, threads, first - start, end - first))
    results.put({"engine": "llama.cpp", "version": llama_cpp.__version__})


def _in_child(target, *args) -> list[dict]:
    context = mp.get_context("spawn")
    results = context.Queue()
    proc = context.Process(target=target, args=(*args, results))
    proc.start()
    rows = []
    while proc.is_alive() or not results.empty():
        try:
            rows.append(results.get(timeout=0.5))
        except Exception:  # queue.Empty
            continue
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"{target.__name__} exited with status {proc.exitcode}")
    return rows


def run_compare_llamacpp(
    args: argparse.Namespace, config: EngineConfig, gguf: Path, prompts: list[list[int]], busy_cores
) -> list[dict]:
    """Alternating runs (ours, llama.cpp, ours, ...), ``args.repeat`` of each; every prompt in
    every run, the first a warm-up. ``busy_cores``: common.busy_cores. Returns one row per engine
    and input length: the best decode rate and the best TTFT of its runs."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise UserError(
            "--compare-llamacpp needs llama-cpp-python: pip install -e '.[bench]' "
            "(it builds llama.cpp from source, ~10 minutes on 2 cores)"
        ) from None
    if args.batch_size != [1]:
        raise UserError(
            "--compare-llamacpp measures one request at a time; leave --batch-size at 1"
        )
    threads = config.cpu_threads or max(1, (os.cpu_count() or 1) - args.busy_cores)
    n_ctx = max(args.input_len) + args.output_len + 64
    config = replace(
        config, cpu_threads=threads, max_kv_tokens=config.max_kv_tokens or n_ctx, device="cpu"
    )
    collected: dict[tuple[str, int], list[dict]] = {}
    about: dict[str, dict] = {}
    with busy_cores(args.busy_cores):
        for _ in range(args.repeat):
            for rows in (
                _in_child(_ours, config, prompts, args.output_len, threads),
                _in_child(_llamacpp, str(gguf), prompts, args.output_len, threads, n_ctx),
            ):
                for row in rows:
                    if "input_len" in row:
                        collected.setdefault((row["engine"], row["input_len"]), []).append(row)
                    else:
                        about[row["engine"]] = row
    out = []
    for (engine, _input_len), runs in sorted(
        collected.items(), key=lambda item: (item[0][1], item[0][0] != "minisgl-chat")
    ):
        best = max(runs, key=lambda r: r["decode_tok_s"])
        out.append(
            {
                "bench": "decode-vs-llamacpp",
                "model": str(gguf),
                "busy_cores": args.busy_cores,
                **about.get(engine, {}),
                **best,
                "ttft_ms": min(r["ttft_ms"] for r in runs),
                "runs": len(runs),
                "decode_tok_s_runs": [r["decode_tok_s"] for r in runs],
            }
        )
    return out


def print_compare_table(rows: list[dict]) -> None:
    print(
        f"{'engine':>14} {'input':>6} {'output':>6} {'threads':>7} {'decode tok/s':>12} {'TTFT ms':>9} {'RSS MB':>8} {'peak MB':>8}"
    )
    print("-" * 78)
    for r in rows:
        print(
            f"{r['engine']:>14} {r['input_len']:>6} {r['output_len']:>6} {r['threads']:>7} {r['decode_tok_s']:>12.2f} "
            f"{r['ttft_ms']:>9.1f} {r['rss_mb']:>8.1f} {r['peak_rss_mb']:>8.1f}"
        )
    print()
