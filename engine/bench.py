"""``minisgl-chat bench``: our engine and Hugging Face transformers on the same weights, in the
same run, printing a readable table and then one JSON line per configuration."""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from dataclasses import replace

import torch

from .config import EngineConfig
from .errors import UserError
from .sampling_params import SamplingParams


WARMUP_LEN = 20  # prompt + output tokens of the untimed first run


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(batch_size: int, input_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, min(vocab, 10000)) for _ in range(input_len)] for _ in range(batch_size)]


def time_engine(llm, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(seconds for the whole batch, seconds to the first token of every request)."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    _sync(llm.engine.device)
    start = time.perf_counter()
    first = None
    for _index, _token, _finish in llm.stream(prompts, params):
        if first is None:
            first = time.perf_counter()
    _sync(llm.engine.device)
    end = time.perf_counter()
    return end - start, (first or end) - start


def hf_model_for(llm, seed: int):
    """transformers' model with exactly our engine's weights."""
    from transformers import AutoModelForCausalLM

    if llm.engine.model_dir is not None and not llm.config.dummy_weights:
        hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_dir, dtype=llm.engine.dtype)
    else:  # random weights: let transformers draw them, then copy them into our model
        torch.manual_seed(seed)
        hf = AutoModelForCausalLM.from_config(llm.engine.hf_config, dtype=llm.engine.dtype)
        llm.engine.model.load_weights(hf.state_dict().items())
    return hf.to(llm.engine.device).eval()


@torch.inference_mode()
def time_hf(hf, prompts: list[list[int]], output_len: int, device: torch.device) -> float:
    input_ids = torch.tensor(prompts, device=device)
    kwargs = dict(
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        pad_token_id=0,
    )
    _sync(device)
    start = time.perf_counter()
    out = hf.generate(input_ids, **kwargs)
    _sync(device)
    assert out.shape[1] == input_ids.shape[1] + output_len
    return time.perf_counter() - start


def run_decode(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    from .llm import LLM

    torch.set_num_threads(torch.get_num_threads())  # every core, for both implementations
    max_len = max(max(args.input_len) + args.output_len, WARMUP_LEN)
    need = max(args.batch_size) * (max_len + 1)
    if config.max_kv_tokens is None:
        config = replace(config, max_kv_tokens=need)
    config = replace(config, max_running_requests=max(config.max_running_requests, max(args.batch_size)))
    llm = LLM(config=config)
    hf = hf_model_for(llm, config.seed) if args.compare_hf else None
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    results = []
    # warm-up: first-call costs (allocator, kernels) are not what we measure
    time_engine(llm, random_prompts(1, WARMUP_LEN - 4, vocab, seed=1), 4)
    if hf is not None:
        time_hf(hf, random_prompts(1, WARMUP_LEN - 4, vocab, seed=1), 4, engine.device)
    for bs in args.batch_size:
        for input_len in args.input_len:
            prompts = random_prompts(bs, input_len, vocab)
            runs = [time_engine(llm, prompts, args.output_len) for _ in range(args.repeat)]
            total, ttft = min(runs)
            row = {
                "bench": "decode",
                "device": device_name(engine.device),
                "model": config.config if config.dummy_weights and config.config else str(engine.model_dir),
                "dtype": str(engine.dtype).removeprefix("torch."),
                "tp": config.tp,
                "cache": config.cache,
                "batch_size": bs,
                "input_len": input_len,
                "output_len": args.output_len,
                "engine_tok_s": round(bs * args.output_len / total, 2),
                "hf_tok_s": None,
                "hf_settings": None,
                "ttft_ms": round(ttft * 1000, 2),
            }
            if hf is not None:
                hf_total = min(time_hf(hf, prompts, args.output_len, engine.device) for _ in range(args.repeat))
                import transformers

                row["hf_tok_s"] = round(bs * args.output_len / hf_total, 2)
                row["hf_settings"] = (
                    f"transformers {transformers.__version__} generate, {row['dtype']}, do_sample=False, "
                    f"min_new_tokens=max_new_tokens={args.output_len}, default cache, {torch.get_num_threads()} threads"
                )
            results.append(row)
    return results


def print_table(rows: list[dict]) -> None:
    header = f"{'batch':>5} {'input':>6} {'output':>6} {'engine tok/s':>13} {'hf tok/s':>9} {'speed-up':>8} {'TTFT ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        hf = r["hf_tok_s"]
        speedup = f"{r['engine_tok_s'] / hf:.2f}x" if hf else "-"
        print(f"{r['batch_size']:>5} {r['input_len']:>6} {r['output_len']:>6} {r['engine_tok_s']:>13.2f} {hf or '-':>9} {speedup:>8} {r['ttft_ms']:>8.1f}")
    print()


def run_bench(args: argparse.Namespace) -> int:
    from .args import engine_config_from_args

    config = engine_config_from_args(args)
    if args.bench == "decode":
        rows = run_decode(args, config)
    else:  # pragma: no cover - argparse rejects unknown benches
        raise UserError(f"unknown benchmark {args.bench!r}")
    print_table(rows)
    for row in rows:
        print(json.dumps(row))
    return 0
