"""``minisgl-chat bench``: ``decode`` runs our engine and Hugging Face transformers on the same
weights in the same run; ``offline`` runs nano-vllm's 256-request workload (and transformers on
a subset of it) and compares with the memory-bandwidth floor; ``multiturn`` runs chats with the
radix prefix cache and without. Each prints a readable table and then one JSON line per
configuration."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import platform
import random
import subprocess
import sys
import time
from dataclasses import replace

import torch

from ..config import EngineConfig
from ..errors import UserError
from ..sampling_params import GrammarSpec, SamplingParams

WARMUP_LEN = 20  # prompt + output tokens of the untimed first run
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before any engine picks its own count


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({TORCH_DEFAULT_THREADS} threads)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({TORCH_DEFAULT_THREADS} threads)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row_header(bench: str, config: EngineConfig, engine) -> dict:
    """The fields every JSON line starts with: which bench, where, which model."""
    return {
        "bench": bench,
        "device": device_name(engine.device),
        "model": config.config if config.dummy_weights and config.config else str(engine.model_dir),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "kv_dtype": str(engine.kv_dtype).removeprefix("torch."),
        "tp": config.tp,
        "dp": config.dp,
    }


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
        from ..weights.gguf_tensors import GGUF_WEIGHTS

        gguf = {"gguf_file": GGUF_WEIGHTS} if (llm.engine.model_dir / GGUF_WEIGHTS).is_file() else {}
        hf = AutoModelForCausalLM.from_pretrained(llm.engine.model_dir, dtype=llm.engine.dtype, **gguf)
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


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` other processes, each keeping one core busy, for as long as the block runs: the
    machine a chat app meets beside a browser or a build (``bench decode --busy-cores N``)."""
    if count < 0:
        raise UserError(f"--busy-cores must be >= 0, got {count}")
    # in sessions of their own, as another program's processes are (the engine does not count
    # its own process group as others)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def threads_of_transformers(llm):
    """transformers runs with torch's own thread count (every core), as its users run it; the
    engine's CPU path then picks its own count again."""
    threads = llm.engine.cpu_threads
    if threads is None:
        yield
        return
    torch.set_num_threads(TORCH_DEFAULT_THREADS)
    try:
        yield
    finally:
        threads.forget_applied()


def run_decode(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    with busy_cores(args.busy_cores):
        return _run_decode(args, config)


def _run_decode(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    from ..llm import LLM

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
                "engine_threads": engine.cpu_threads.applied if engine.cpu_threads is not None else None,
            }
            if hf is not None:
                with threads_of_transformers(llm):
                    hf_total = min(time_hf(hf, prompts, args.output_len, engine.device) for _ in range(args.repeat))
                    hf_threads = torch.get_num_threads()
                import transformers

                row["hf_tok_s"] = round(bs * args.output_len / hf_total, 2)
                row["hf_settings"] = (
                    f"transformers {transformers.__version__} generate, {row['dtype']}, do_sample=False, "
                    f"min_new_tokens=max_new_tokens={args.output_len}, default cache, {hf_threads} threads"
                )
            results.append(row)
    return results


def time_turn(llm, prompts: list[list[int]], params: SamplingParams) -> tuple[list[float], list[list[int]]]:
    """One turn of every conversation at once: (seconds to each one's first token, replies)."""
    _sync(llm.engine.device)
    start = time.perf_counter()
    firsts: list[float | None] = [None] * len(prompts)
    replies: list[list[int]] = [[] for _ in prompts]
    for index, token, _finish in llm.stream(prompts, params):
        if token is None:
            continue
        if firsts[index] is None:
            firsts[index] = time.perf_counter() - start
        replies[index].append(token)
    return [f if f is not None else time.perf_counter() - start for f in firsts], replies


def run_multiturn(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    """Chats that resend their whole history every turn (prompt = previous prompt + reply + a
    new user message), over one shared system prompt, with ``--cache radix`` and ``naive``.

    Both engines are loaded side by side and play each turn in alternation, so load from other
    work on the machine falls on both alike. Each starts with one untimed request of the system
    prompt alone (first-call costs; the radix cache then holds the system prompt, as a server
    that has served one chat already does)."""
    from ..engine import default_page_size
    from ..llm import LLM
    from ..model_loader import resolve_device

    convs, turns = args.conversations, args.turns
    page = config.page_size or default_page_size(resolve_device(config.device).type)
    per_conv = args.system_len + turns * (args.user_len + args.reply_len) + 1
    if config.max_kv_tokens is None:  # room for every history at once: nothing is evicted
        config = replace(config, max_kv_tokens=convs * (per_conv + page) + args.system_len + page)
    config = replace(config, max_running_requests=max(config.max_running_requests, convs))
    llms = {cache: LLM(config=replace(config, cache=cache)) for cache in ("radix", "naive")}
    ttft_ms, regenerate_ms, histories = play_multiturn(args, llms)
    identical = histories["radix"] == histories["naive"]
    engine = llms["radix"].engine
    return [{
        **row_header("multiturn", config, engine),
        "cache": cache,
        "page_size": page,
        "conversations": convs,
        "turns": turns,
        "system_len": args.system_len,
        "user_len": args.user_len,
        "reply_len": args.reply_len,
        "ttft_ms_per_turn": ttft_ms[cache],
        "last_turn_ttft_ms": ttft_ms[cache][-1],
        "regenerate_ttft_ms": regenerate_ms[cache],
        "prefix_cache_hit_tokens": llm.scheduler.stats().prefix_cache_hit_tokens_total,
        "replies_identical": identical,
    } for cache, llm in llms.items()]


def play_multiturn(args: argparse.Namespace, llms: dict) -> tuple[dict[str, list[float]], dict[str, float], dict[str, list[list[int]]]]:
    """The turns of every conversation, on each engine of ``llms`` in alternation, then a
    regenerate of the last reply: (mean TTFT ms of each turn, of the regenerate, and the
    conversations' token histories), each by engine."""
    convs, turns = args.conversations, args.turns
    rng = random.Random(0)
    vocab = min(next(iter(llms.values())).engine.model_config.vocab_size, 10000)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    system = ids(args.system_len)
    users = [[ids(args.user_len) for _ in range(turns)] for _ in range(convs)]
    params = SamplingParams(max_tokens=args.reply_len, ignore_eos=True)
    histories = {cache: [list(system) for _ in range(convs)] for cache in llms}
    ttft_ms: dict[str, list[float]] = {cache: [] for cache in llms}
    for llm in llms.values():
        llm.generate([system], SamplingParams(max_tokens=1, ignore_eos=True))
    for turn in range(turns):
        for cache, llm in llms.items():
            prompts = [history + users[c][turn] for c, history in enumerate(histories[cache])]
            firsts, replies = time_turn(llm, prompts, params)
            ttft_ms[cache].append(round(1000 * sum(firsts) / len(firsts), 2))
            histories[cache] = [prompt + reply for prompt, reply in zip(prompts, replies)]
    # Regenerate (the chat's ↻): the last turn's prompt again. The radix cache holds all of it;
    # the naive cache prefills it cold, as a first request of that prompt would.
    regenerate_ms: dict[str, float] = {}
    for cache, llm in llms.items():
        prompts = [history[: len(history) - args.reply_len] for history in histories[cache]]
        firsts, _ = time_turn(llm, prompts, params)
        regenerate_ms[cache] = round(1000 * sum(firsts) / len(firsts), 2)
    return ttft_ms, regenerate_ms, histories


def print_multiturn_table(rows: list[dict]) -> None:
    by_cache = {r["cache"]: r["ttft_ms_per_turn"] for r in rows}
    header = f"{'turn':>4} {'radix TTFT ms':>14} {'naive TTFT ms':>14} {'radix/naive':>12}"
    print(header)
    print("-" * len(header))
    for turn, (radix, naive) in enumerate(zip(by_cache["radix"], by_cache["naive"]), start=1):
        print(f"{turn:>4} {radix:>14.1f} {naive:>14.1f} {radix / naive if naive else float('nan'):>12.2f}")
    regen = {r["cache"]: r["regenerate_ttft_ms"] for r in rows}
    print(f"{'regenerate last reply':>21}: radix {regen['radix']:.1f} ms, naive (cold) {regen['naive']:.1f} ms")
    print(f"greedy replies identical under both caches: {'yes' if rows[0]['replies_identical'] else 'NO'}")
    print()


def offline_workload(num_requests: int, max_input_len: int, max_output_len: int, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py: with ``random.seed(0)``, each request's input length uniform in
    [100, max_input_len] and then that many ids in [0, 10000]; after all prompts, each output
    length in [100, max_output_len]. 256 requests: 142,827 input and 133,966 output tokens.
    (A maximum below 100 makes every length that maximum; a vocabulary of 10,000 ids or fewer
    bounds the ids by its size instead.)"""
    rng = random.Random(seed)
    top = min(10000, vocab_size - 1)
    prompts = [[rng.randint(0, top) for _ in range(rng.randint(min(100, max_input_len), max_input_len))] for _ in range(num_requests)]
    output_lens = [rng.randint(min(100, max_output_len), max_output_len) for _ in range(num_requests)]
    return prompts, output_lens


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes per second a large device-to-device copy moves (read + write): the roof for
    memory-bound decode on this GPU, measured rather than taken from a datasheet."""
    if device.type != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 10
    del src, dst
    return 2 * (1 << 30) / seconds


def bandwidth_floor_s(engine, prompts: list[list[int]], output_lens: list[int], bandwidth: float) -> float:
    """Seconds to read every weight once per decode step (all requests decoding together, so
    max(output_lens) steps) and every KV entry once per step that attends to it."""
    from ..kvcache import KVPool
    from ..model_loader import param_bytes

    mc = engine.model_config
    kv_per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, engine.kv_dtype)
    kv_reads = sum(out * len(p) + out * (out - 1) // 2 for p, out in zip(prompts, output_lens))
    weight_reads = max(output_lens) * param_bytes(mc, engine.dtype)
    return (weight_reads + kv_reads * kv_per_token) / bandwidth


@torch.inference_mode()
def time_hf_sampled(hf, prompts: list[list[int]], output_lens: list[int], device: torch.device) -> float:
    """transformers on requests of different lengths: one left-padded batch, sampling at
    temperature 0.6, every row generating max(output_lens) tokens."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    n = max(output_lens)
    _sync(device)
    start = time.perf_counter()
    hf.generate(ids, attention_mask=mask, do_sample=True, temperature=0.6, top_k=0, top_p=1.0,
                max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    _sync(device)
    return time.perf_counter() - start


BENCH_SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 64}, "score": {"type": "integer"},
                                                 "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}}},
                "required": ["title", "score", "tags"], "additionalProperties": False}


def offline_params(output_lens: list[int], extras_share: float) -> list[SamplingParams]:
    """The workload's sampling: every request sampled at temperature 0.6 to its length; with
    ``extras_share`` s, a share s of them also asks for penalties and logprobs and another
    share s for a JSON schema (spread evenly through the list)."""
    params = []
    for i, n in enumerate(output_lens):
        p = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n)
        if extras_share > 0:
            slot = (i * extras_share) % 1.0  # lands in [0, s) for a share s of the requests, in [s, 2s) for another
            if slot < extras_share:
                p = replace(p, frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1, logprobs=True, top_logprobs=5)
            elif slot < 2 * extras_share:
                p = replace(p, grammar=GrammarSpec("json_schema", json.dumps(BENCH_SCHEMA)))
        params.append(p)
    return params


def run_offline(args: argparse.Namespace, config: EngineConfig, share: tuple[int, object] | None = None) -> list[dict]:
    """``share`` = (replica, barrier): one replica of ``bench offline --dp N`` runs requests
    replica, replica + N, ... and starts its clock when every replica is loaded and warm."""
    from ..llm import LLM

    if args.max_input_len < 1 or args.max_output_len < 1:
        raise UserError("--max-input-len and --max-output-len must be >= 1")
    if not 0 <= args.extras_share <= 0.5:
        raise UserError(f"--extras-share must be in [0, 0.5], got {args.extras_share}")
    config = replace(config, max_running_requests=max(config.max_running_requests, args.num_requests))
    llm = LLM(config=config)
    engine = llm.engine
    prompts, output_lens = offline_workload(args.num_requests, args.max_input_len, args.max_output_len, engine.model_config.vocab_size)
    if share is not None:
        prompts, output_lens = prompts[share[0]::config.dp], output_lens[share[0]::config.dp]
    params = offline_params(output_lens, args.extras_share)
    bandwidth = copy_bandwidth(engine.device)
    # warm-up, sampled like the workload (one request of each kind in it): first-use costs (a
    # kernel module's loading, the grammar compiler's vocabulary scan) are not timed
    kinds = {(p.has_penalties, p.grammar is not None): p for p in params}
    llm.generate([prompts[0][:32]] * len(kinds), [replace(p, max_tokens=8) for p in kinds.values()])
    _sync(engine.device)
    if share is not None:
        share[1].wait()  # every replica starts together
    started_at = time.time()
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    _sync(engine.device)
    seconds = time.perf_counter() - start
    produced = sum(len(r.token_ids) for r in results)
    assert produced == sum(output_lens), "every request must produce exactly its max_tokens"
    row = {
        **row_header("offline", config, engine),
        "attention": engine.attn_name,
        "page_size": engine.page_size,
        "cuda_graphs": engine.uses_cuda_graphs,
        "overlap": llm.scheduler.overlap,
        "requests": len(prompts),
        "extras_share": args.extras_share,
        "penalized_requests": sum(p.has_penalties for p in params),
        "json_schema_requests": sum(p.grammar is not None for p in params),
        "input_tokens": sum(map(len, prompts)),
        "output_tokens": produced,
        "seconds": round(seconds, 3),
        "engine_tok_s": round(produced / seconds, 1),
        "hf_requests": None,
        "hf_tok_s": None,
        "engine_tok_s_on_hf_subset": None,
        "hf_settings": None,
        "copy_bandwidth_tb_s": None,
        "bandwidth_floor_s": None,
        "share_of_floor": None,
    }
    if share is not None:
        row.update(started_at=started_at, ended_at=started_at + seconds, replica_device=str(engine.device))
        return [row]
    if bandwidth is not None:
        floor = bandwidth_floor_s(engine, prompts, output_lens, bandwidth)
        row.update(copy_bandwidth_tb_s=round(bandwidth / 1e12, 2), bandwidth_floor_s=round(floor, 3), share_of_floor=round(floor / seconds, 3))
    if args.compare_hf:
        row.update(_offline_against_hf(args, llm, prompts, output_lens))
    return [row]


def _offline_against_hf(args: argparse.Namespace, llm, prompts: list[list[int]], output_lens: list[int]) -> dict:
    """transformers on the workload's first requests (outputs capped), beside our engine on the
    same subset: the row's hf_* fields."""
    import transformers

    engine = llm.engine
    k = min(args.hf_requests, args.num_requests)
    # transformers runs ~10 decode steps a second at any batch size: cap the outputs
    sub_prompts, sub_lens = prompts[:k], [min(n, args.hf_output_len) for n in output_lens[:k]]
    _sync(engine.device)
    start = time.perf_counter()
    llm.generate(sub_prompts, [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in sub_lens])
    _sync(engine.device)
    ours = round(sum(sub_lens) / (time.perf_counter() - start), 1)
    hf = hf_model_for(llm, llm.config.seed)
    time_hf_sampled(hf, [p[:16] for p in sub_prompts[:1]], [4], engine.device)  # warm-up
    hf_seconds = time_hf_sampled(hf, sub_prompts, sub_lens, engine.device)
    dtype = str(engine.dtype).removeprefix("torch.")
    return {
        "engine_tok_s_on_hf_subset": ours,
        "hf_requests": k,
        "hf_tok_s": round(sum(sub_lens) / hf_seconds, 1),
        "hf_settings": (
            f"transformers {transformers.__version__} generate, {dtype}, the first {k} requests' prompts "
            f"with outputs capped at {args.hf_output_len} tokens, as one left-padded batch, do_sample temperature 0.6, "
            f"every row {max(sub_lens)} new tokens; tok/s counts the {sum(sub_lens)} tokens asked for; "
            f"engine_tok_s_on_hf_subset is our engine on the same subset"
        ),
    }


def print_routed_table(rows: list[dict]) -> None:
    by_routing = {r["routing"]: r for r in rows}
    names = list(by_routing)
    print(f"{'turn':>4} " + " ".join(f"{name + ' TTFT ms':>22}" for name in names))
    for turn in range(len(rows[0]["ttft_ms_per_turn"])):
        print(f"{turn + 1:>4} " + " ".join(f"{by_routing[name]['ttft_ms_per_turn'][turn]:>22.1f}" for name in names))
    for name, r in by_routing.items():
        print(f"{name}: prefix-cache hits {r['prefix_cache_hit_tokens']:,} tokens, per replica {r['replica_prefix_cache_hit_tokens']}")
    print()


def print_offline(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['requests']} requests, {r['input_tokens']} input / {r['output_tokens']} output tokens in {r['seconds']:.2f} s: "
              f"{r['engine_tok_s']:.0f} tok/s ({r['attention']}, graphs {'on' if r['cuda_graphs'] else 'off'}, overlap {'on' if r['overlap'] else 'off'})")
        if r["bandwidth_floor_s"] is not None:
            print(f"memory-bandwidth floor {r['bandwidth_floor_s']:.2f} s at {r['copy_bandwidth_tb_s']} TB/s: {100 * r['share_of_floor']:.0f}% of it reached")
        if r["hf_tok_s"] is not None:
            print(f"first {r['hf_requests']} requests: engine {r['engine_tok_s_on_hf_subset']:.0f} tok/s, transformers {r['hf_tok_s']:.0f} tok/s")
    print()


def print_table(rows: list[dict]) -> None:
    header = f"{'batch':>5} {'input':>6} {'output':>6} {'engine tok/s':>13} {'hf tok/s':>9} {'speed-up':>8} {'TTFT ms':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        hf = r["hf_tok_s"]
        speedup = f"{r['engine_tok_s'] / hf:.2f}x" if hf else "-"
        print(f"{r['batch_size']:>5} {r['input_len']:>6} {r['output_len']:>6} {r['engine_tok_s']:>13.2f} {hf or '-':>9} {speedup:>8} {r['ttft_ms']:>8.1f}")
    print()


BENCHES = {"decode": (run_decode, print_table), "offline": (run_offline, print_offline), "multiturn": (run_multiturn, print_multiturn_table)}


def _bench_rank(rank: int, args: argparse.Namespace, config: EngineConfig, addr: str) -> None:
    """One tensor-parallel rank of a bench: every rank runs the same schedule (SPMD); rank 0
    prints. transformers is not compared under --tp (it would run on rank 0 alone)."""
    from ..distributed import init_tp, shutdown_tp
    from ..model_loader import resolve_device
    from ..workers.scheduler_worker import rank_device

    config = replace(config, device=rank_device(config, rank))
    init_tp(rank, config.tp, f"tcp://{addr}", resolve_device(config.device), timeout_s=600)
    if args.bench == "decode" and args.compare_llamacpp:
        rows = _compare_llamacpp(args, config)
        for row in rows:
            print(json.dumps(row))
        return 0
    run, show = BENCHES[args.bench]
    rows = run(args, config)
    if rank == 0:
        show(rows)
        for row in rows:
            print(json.dumps(row), flush=True)
    shutdown_tp()


def _offline_replica(replica: int, args: argparse.Namespace, config: EngineConfig, barrier, results) -> None:
    """One replica of ``bench offline --dp N``: its own process and GPU, its share of the requests."""
    from ..workers.scheduler_worker import rank_device

    config = replace(config, device=rank_device(config, replica))
    if config.device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(config.device))
    [row] = run_offline(args, config, share=(replica, barrier))
    results.put(row)


def run_offline_dp(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    """nano-vllm's workload over ``--dp N`` replicas, one process each, the requests dealt out in
    turn (what the front end's least-loaded routing does with prompts that share nothing).
    The time is from the replicas' common start to the last one's end."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(config.dp), ctx.Queue()
    procs = [ctx.Process(target=_offline_replica, args=(i, args, config, barrier, results)) for i in range(config.dp)]
    for proc in procs:
        proc.start()
    rows = []
    while len(rows) < config.dp:
        try:
            rows.append(results.get(timeout=5))
        except Exception:  # queue.Empty: is every replica still running?
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a replica of bench offline --dp failed (its error is above)") from None
    for proc in procs:
        proc.join()
    start, end = min(r["started_at"] for r in rows), max(r["ended_at"] for r in rows)
    produced = sum(r["output_tokens"] for r in rows)
    rows.sort(key=lambda r: r["replica_device"])
    row = {k: v for k, v in rows[0].items() if k not in ("started_at", "ended_at", "replica_device")}
    row.update(
        requests=sum(r["requests"] for r in rows),
        input_tokens=sum(r["input_tokens"] for r in rows),
        output_tokens=produced,
        seconds=round(end - start, 3),
        engine_tok_s=round(produced / (end - start), 1),
        replica_seconds=[r["seconds"] for r in rows],
        replica_devices=[r["replica_device"] for r in rows],
    )
    return [row]


def _compare_llamacpp(args: argparse.Namespace, config: EngineConfig) -> list[dict]:
    from ..weights.gguf_tensors import GGUF_WEIGHTS
    from ..weights.source import resolve_model
    from .bench_llamacpp import print_compare_table, run_compare_llamacpp

    if args.compare_hf or config.dummy_weights or config.tp > 1:
        raise UserError("--compare-llamacpp runs alone: without --compare-hf, --dummy-weights and --tp")
    gguf = resolve_model(config.model) / GGUF_WEIGHTS
    if not gguf.is_file():
        raise UserError("--compare-llamacpp needs a GGUF model: the demo model or --model FILE.gguf")
    vocab = json.loads((gguf.parent / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    prompts = random_prompts(1, 32, vocab, seed=1) + [random_prompts(1, n, vocab, seed=100 + n)[0] for n in args.input_len]
    rows = run_compare_llamacpp(args, config, gguf, prompts, busy_cores)
    print_compare_table(rows)
    return rows


def run_bench(args: argparse.Namespace) -> int:
    from ..args import engine_config_from_args

    config = engine_config_from_args(args)
    if args.bench not in BENCHES:  # pragma: no cover - argparse rejects unknown benches
        raise UserError(f"unknown benchmark {args.bench!r}")
    if config.dp < 1:
        raise UserError(f"--dp must be at least 1, got {config.dp}")
    if config.dp > 1:
        from ..api.server import prepare_model

        if args.bench == "offline" and args.num_requests < config.dp:
            raise UserError(f"--num-requests {args.num_requests} leaves a replica of --dp {config.dp} without work; ask for at least {config.dp}")

        if args.bench == "decode" or config.tp > 1 or getattr(args, "compare_hf", False):
            raise UserError("bench --dp N runs offline (one replica per GPU) and multiturn (through the front end's router), "
                            "with --tp 1 and without --compare-hf")
        config, model_config, _ = prepare_model(config)  # resolves the model once for all replicas and checks the GPUs
        if args.bench == "offline":
            rows = run_offline_dp(args, config)
            print_offline(rows)
        else:
            from .dp_bench import run_multiturn_routed

            rows = run_multiturn_routed(args, config, model_config.max_context_len, model_config.vocab_size)
            print_routed_table(rows)
        for row in rows:
            print(json.dumps(row))
        return 0
    if config.tp > 1:
        import torch.multiprocessing as mp

        from ..api.server import prepare_model
        from ..workers.launcher import free_port

        config, _, _ = prepare_model(config)  # resolves the model once for all ranks and checks --tp
        if getattr(args, "compare_hf", False):
            raise UserError("--compare-hf runs transformers on one device; use it with --tp 1")
        mp.start_processes(_bench_rank, args=(args, config, f"127.0.0.1:{free_port()}"), nprocs=config.tp, join=True, start_method="spawn")
        return 0
    if args.bench == "decode" and args.compare_llamacpp:
        rows = _compare_llamacpp(args, config)
        for row in rows:
            print(json.dumps(row))
        return 0
    run, show = BENCHES[args.bench]
    rows = run(args, config)
    show(rows)
    for row in rows:
        print(json.dumps(row))
    return 0
