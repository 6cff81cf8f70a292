"""``bench offline``: nano-vllm's 256-request workload (and transformers on a subset of it),
compared with the memory-bandwidth floor; ``--dp N`` deals it out over N replicas."""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

import torch

from ..config import EngineConfig
from ..errors import UserError
from ..sampling_params import GrammarSpec, SamplingParams
from .common import hf_model_for, row_header, sync_device


def offline_workload(
    num_requests: int, max_input_len: int, max_output_len: int, vocab_size: int, seed: int = 0
) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py: with ``random.seed(0)``, each request's input length uniform in
    [100, max_input_len] and then that many ids in [0, 10000]; after all prompts, each output
    length in [100, max_output_len]. 256 requests: 142,827 input and 133,966 output tokens.
    (A maximum below 100 makes every length that maximum; a vocabulary of 10,000 ids or fewer
    bounds the ids by its size instead.)"""
    rng = random.Random(seed)
    top = min(10000, vocab_size - 1)
    prompts = [
        [rng.randint(0, top) for _ in range(rng.randint(min(100, max_input_len), max_input_len))]
        for _ in range(num_requests)
    ]
    output_lens = [
        rng.randint(min(100, max_output_len), max_output_len) for _ in range(num_requests)
    ]
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


def bandwidth_floor_s(
    engine, prompts: list[list[int]], output_lens: list[int], bandwidth: float
) -> float:
    """Seconds to read every weight once per decode step (all requests decoding together, so
    max(output_lens) steps) and every KV entry once per step that attends to it."""
    from ..kvcache import KVPool
    from ..model_loader import param_bytes

    mc = engine.model_config
    kv_per_token = KVPool.bytes_per_token(
        mc.num_layers, mc.num_kv_heads, mc.head_dim, engine.kv_dtype
    )
    kv_reads = sum(out * len(p) + out * (out - 1) // 2 for p, out in zip(prompts, output_lens))
    weight_reads = max(output_lens) * param_bytes(mc, engine.dtype)
    return (weight_reads + kv_reads * kv_per_token) / bandwidth


@torch.inference_mode()
def time_hf_sampled(
    hf, prompts: list[list[int]], output_lens: list[int], device: torch.device
) -> float:
    """transformers on requests of different lengths: one left-padded batch, sampling at
    temperature 0.6, every row generating max(output_lens) tokens."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    n = max(output_lens)
    sync_device(device)
    start = time.perf_counter()
    hf.generate(
        ids,
        attention_mask=mask,
        do_sample=True,
        temperature=0.6,
        top_k=0,
        top_p=1.0,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
    )
    sync_device(device)
    return time.perf_counter() - start


BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 64},
        "score": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}},
    },
    "required": ["title", "score", "tags"],
    "additionalProperties": False,
}


def offline_params(output_lens: list[int], extras_share: float) -> list[SamplingParams]:
    """The workload's sampling: every request sampled at temperature 0.6 to its length; with
    ``extras_share`` s, a share s of them also asks for penalties and logprobs and another
    share s for a JSON schema (spread evenly through the list)."""
    params = []
    for i, n in enumerate(output_lens):
        p = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n)
        if extras_share > 0:
            slot = (
                i * extras_share
            ) % 1.0  # lands in [0, s) for a share s of the requests, in [s, 2s) for another
            if slot < extras_share:
                p = replace(
                    p,
                    frequency_penalty=0.5,
                    presence_penalty=0.3,
                    repetition_penalty=1.1,
                    logprobs=True,
                    top_logprobs=5,
                )
            elif slot < 2 * extras_share:
                p = replace(p, grammar=GrammarSpec("json_schema", json.dumps(BENCH_SCHEMA)))
        params.append(p)
    return params


def run_offline(
    args: argparse.Namespace, config: EngineConfig, share: tuple[int, object] | None = None
) -> list[dict]:
    """``share`` = (replica, barrier): one replica of ``bench offline --dp N`` runs requests
    replica, replica + N, ... and starts its clock when every replica is loaded and warm."""
    from ..llm import LLM

    if args.max_input_len < 1 or args.max_output_len < 1:
        raise UserError("--max-input-len and --max-output-len must be >= 1")
    if not 0 <= args.extras_share <= 0.5:
        raise UserError(f"--extras-share must be in [0, 0.5], got {args.extras_share}")
    config = replace(
        config, max_running_requests=max(config.max_running_requests, args.num_requests)
    )
    llm = LLM(config=config)
    engine = llm.engine
    prompts, output_lens = offline_workload(
        args.num_requests, args.max_input_len, args.max_output_len, engine.model_config.vocab_size
    )
    if share is not None:
        prompts, output_lens = prompts[share[0] :: config.dp], output_lens[share[0] :: config.dp]
    params = offline_params(output_lens, args.extras_share)
    bandwidth = copy_bandwidth(engine.device)
    # warm-up, sampled like the workload (one request of each kind in it): first-use costs (a
    # kernel module's loading, the grammar compiler's vocabulary scan) are not timed
    kinds = {(p.has_penalties, p.grammar is not None): p for p in params}
    llm.generate([prompts[0][:32]] * len(kinds), [replace(p, max_tokens=8) for p in kinds.values()])
    sync_device(engine.device)
    if share is not None:
        share[1].wait()  # every replica starts together
    started_at = time.time()
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    sync_device(engine.device)
    seconds = time.perf_counter() - start
    produced = sum(len(r.token_ids) for r in results)
    assert produced == sum(output_lens), "every request must produce exactly its max_tokens"
    row = _offline_row(args, llm, prompts, params, produced, seconds)
    if share is not None:
        row.update(
            started_at=started_at, ended_at=started_at + seconds, replica_device=str(engine.device)
        )
        return [row]
    if bandwidth is not None:
        floor = bandwidth_floor_s(engine, prompts, output_lens, bandwidth)
        row.update(
            copy_bandwidth_tb_s=round(bandwidth / 1e12, 2),
            bandwidth_floor_s=round(floor, 3),
            share_of_floor=round(floor / seconds, 3),
        )
    if args.compare_hf:
        row.update(_offline_against_hf(args, llm, prompts, output_lens))
    return [row]


def _offline_row(
    args: argparse.Namespace,
    llm,
    prompts: list[list[int]],
    params: list[SamplingParams],
    produced: int,
    seconds: float,
) -> dict:
    """The run's JSON line; the fields that a comparison or the bandwidth floor fills are None."""
    engine = llm.engine
    return {
        **row_header("offline", llm.config, engine),
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


def _offline_against_hf(
    args: argparse.Namespace, llm, prompts: list[list[int]], output_lens: list[int]
) -> dict:
    """transformers on the workload's first requests (outputs capped), beside our engine on the
    same subset: the row's hf_* fields."""
    import transformers

    engine = llm.engine
    k = min(args.hf_requests, args.num_requests)
    # transformers runs ~10 decode steps a second at any batch size: cap the outputs
    sub_prompts, sub_lens = prompts[:k], [min(n, args.hf_output_len) for n in output_lens[:k]]
    sync_device(engine.device)
    start = time.perf_counter()
    llm.generate(
        sub_prompts,
        [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in sub_lens],
    )
    sync_device(engine.device)
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


def print_offline(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"{r['requests']} requests, {r['input_tokens']} input / {r['output_tokens']} output tokens in {r['seconds']:.2f} s: "
            f"{r['engine_tok_s']:.0f} tok/s ({r['attention']}, graphs {'on' if r['cuda_graphs'] else 'off'}, overlap {'on' if r['overlap'] else 'off'})"
        )
        if r["bandwidth_floor_s"] is not None:
            print(
                f"memory-bandwidth floor {r['bandwidth_floor_s']:.2f} s at {r['copy_bandwidth_tb_s']} TB/s: {100 * r['share_of_floor']:.0f}% of it reached"
            )
        if r["hf_tok_s"] is not None:
            print(
                f"first {r['hf_requests']} requests: engine {r['engine_tok_s_on_hf_subset']:.0f} tok/s, transformers {r['hf_tok_s']:.0f} tok/s"
            )
    print()


def _offline_replica(
    replica: int, args: argparse.Namespace, config: EngineConfig, barrier, results
) -> None:
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
    procs = [
        ctx.Process(target=_offline_replica, args=(i, args, config, barrier, results))
        for i in range(config.dp)
    ]
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
                raise RuntimeError(
                    "a replica of bench offline --dp failed (its error is above)"
                ) from None
    for proc in procs:
        proc.join()
    start, end = min(r["started_at"] for r in rows), max(r["ended_at"] for r in rows)
    produced = sum(r["output_tokens"] for r in rows)
    rows.sort(key=lambda r: r["replica_device"])
    row = {
        k: v for k, v in rows[0].items() if k not in ("started_at", "ended_at", "replica_device")
    }
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
