"""``bench decode``: our engine and Hugging Face transformers on the same weights in the same run,
at each batch size and prompt length (or llama.cpp beside us, ``--compare-llamacpp``)."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace

import torch

from ..config import EngineConfig
from ..errors import UserError
from .common import (
    WARMUP_LEN,
    busy_cores,
    hf_model_for,
    random_prompts,
    row_header,
    threads_of_transformers,
    time_engine,
    time_hf,
)


def run_decode(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    with busy_cores(args.busy_cores):
        return _run_decode(args, config)


def _run_decode(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    from ..llm import LLM

    max_len = max(max(args.input_len) + args.output_len, WARMUP_LEN)
    need = max(args.batch_size) * (max_len + 1)
    if config.max_kv_tokens is None:
        config = replace(config, max_kv_tokens=need)
    config = replace(
        config, max_running_requests=max(config.max_running_requests, max(args.batch_size))
    )
    llm = LLM(config=config)
    hf = hf_model_for(llm, config.seed) if args.compare_hf else None
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    results = []
    # warm-up: first-call costs (allocator, kernels) are not what we measure
    time_engine(llm, random_prompts(1, WARMUP_LEN - 4, vocab, seed=1), 4)
    if hf is not None:
        with threads_of_transformers(llm):
            time_hf(hf, random_prompts(1, WARMUP_LEN - 4, vocab, seed=1), 4, engine.device)
    seeds = itertools.count(100)  # fresh prompts for every run: the prefix cache must find nothing
    for bs in args.batch_size:
        for input_len in args.input_len:
            runs = []
            for _ in range(args.repeat):
                prompts = random_prompts(bs, input_len, vocab, next(seeds))
                runs.append(time_engine(llm, prompts, args.output_len))
            total, ttft = min(runs)
            row = {
                **row_header("decode", config, engine),
                "cache": config.cache,
                "page_size": engine.page_size,
                "batch_size": bs,
                "input_len": input_len,
                "output_len": args.output_len,
                "engine_tok_s": round(bs * args.output_len / total, 2),
                "hf_tok_s": None,
                "hf_settings": None,
                "ttft_ms": round(ttft * 1000, 2),
                "busy_cores": args.busy_cores,
                # CPU: the engine's thread count at the end of the run (it follows the free cores)
                "engine_threads": engine.cpu_threads.applied
                if engine.cpu_threads is not None
                else None,
            }
            if hf is not None:
                row.update(_hf_fields(args, llm, hf, prompts, row["dtype"]))
            results.append(row)
    return results


def _hf_fields(args: argparse.Namespace, llm, hf, prompts: list[list[int]], dtype: str) -> dict:
    """transformers on the same prompts as the row's engine run: the row's hf_* fields."""
    import transformers

    with threads_of_transformers(llm):
        hf_total = min(
            time_hf(hf, prompts, args.output_len, llm.engine.device) for _ in range(args.repeat)
        )
        hf_threads = torch.get_num_threads()
    return {
        "hf_tok_s": round(len(prompts) * args.output_len / hf_total, 2),
        "hf_settings": (
            f"transformers {transformers.__version__} generate, {dtype}, do_sample=False, "
            f"min_new_tokens=max_new_tokens={args.output_len}, default cache, {hf_threads} threads"
        ),
    }


def print_table(rows: list[dict]) -> None:
    header = f"{'batch':>5} {'input':>6} {'output':>6} {'engine tok/s':>13} {'hf tok/s':>9} {'speed-up':>8} {'TTFT ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        hf = r["hf_tok_s"]
        speedup = f"{r['engine_tok_s'] / hf:.2f}x" if hf else "-"
        print(
            f"{r['batch_size']:>5} {r['input_len']:>6} {r['output_len']:>6} {r['engine_tok_s']:>13.2f} {hf or '-':>9} {speedup:>8} {r['ttft_ms']:>8.1f}"
        )
    print()


def compare_llamacpp(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    from ..weights.gguf_tensors import GGUF_WEIGHTS
    from ..weights.source import resolve_model
    from .bench_llamacpp import print_compare_table, run_compare_llamacpp

    if args.compare_hf or config.dummy_weights or config.tp > 1:
        raise UserError(
            "--compare-llamacpp runs alone: without --compare-hf, --dummy-weights and --tp"
        )
    gguf = resolve_model(config.model) / GGUF_WEIGHTS
    if not gguf.is_file():
        raise UserError(
            "--compare-llamacpp needs a GGUF model: the demo model or --model FILE.gguf"
        )
    vocab = json.loads((gguf.parent / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    prompts = random_prompts(1, 32, vocab, seed=1) + [
        random_prompts(1, n, vocab, seed=100 + n)[0] for n in args.input_len
    ]
    rows = run_compare_llamacpp(args, config, gguf, prompts, busy_cores)
    print_compare_table(rows)
    return rows
