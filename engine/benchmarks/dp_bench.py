"""``bench multiturn --dp N``: chat turns through the real front end and its replica router, with
prefix-aware routing and with round-robin, each on a fresh set of engine processes.

The in-process multiturn bench (multiturn_bench.py) compares caches on one engine; here the
question is where a turn lands: a chat whose next turn reaches the replica that served its last
one finds its history in that replica's radix cache, one that lands elsewhere prefills it again.
No HTTP: the bench drives ``FrontendClient`` over the same ZeroMQ sockets the server uses.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from dataclasses import replace

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from ..workers.frontend import FrontendClient, GenerateRequest, wait_first
from ..workers.ipc import SocketPaths, make_runtime_dir, remove_runtime_dir
from ..workers.launcher import EngineProcesses, reporting_workers
from ..workers.router import ROUTING_POLICIES

START_TIMEOUT_S = 600.0  # a fresh GPU machine compiles kernels and captures graphs first


def run_multiturn_routed(
    args: argparse.Namespace, config: EngineConfig, max_context: int, vocab_size: int
) -> list[dict]:
    return [
        asyncio.run(
            _one_routing(args, replace(config, dp_routing=routing), max_context, vocab_size)
        )
        for routing in ROUTING_POLICIES
    ]


async def _one_routing(
    args: argparse.Namespace, config: EngineConfig, max_context: int, vocab_size: int
) -> dict:
    from ..api.server import served_model_name

    runtime_dir = make_runtime_dir()
    paths = SocketPaths(str(runtime_dir), 1, config.dp)
    client = FrontendClient(
        paths,
        served_model_name(config),
        reporting_workers(1, config.dp, config.tp),
        config.dp_routing,
    )
    client.start()
    loop = asyncio.get_running_loop()
    died: list[str] = []
    a_worker_died = asyncio.Event()

    def on_exit(name: str, code: int | None) -> None:  # the watcher thread's
        died.append(f"{name} exited (exit code {code})")
        loop.call_soon_threadsafe(a_worker_died.set)

    procs = EngineProcesses(config, paths, config.tokenizer, max_context, logging.WARNING)
    procs.start(on_exit)
    try:
        await wait_first(client.ready_event, a_worker_died, timeout=START_TIMEOUT_S)
        if not client.ready:
            raise RuntimeError(
                f"the engine did not start: {client.startup_errors or died or 'timed out'}"
            )
        ttft_ms, sent = await _play(args, client, vocab_size)
        # the replicas' last figures, pushed as each request ends
        await client.wait_for_stats(
            lambda s: s.requests_finished_total + s.requests_aborted_total >= sent, 10
        )
        return _routed_row(args, config, client, ttft_ms)
    finally:
        procs.stop()
        client.close()
        remove_runtime_dir(runtime_dir)


def _routed_row(
    args: argparse.Namespace, config: EngineConfig, client: FrontendClient, ttft_ms: list[float]
) -> dict:
    """One routing's JSON line, from the replicas' last figures."""
    per_replica = [client.replica_stats[i].prefix_cache_hit_tokens_total for i in range(config.dp)]
    info = client.scheduler_info
    return {
        "bench": "multiturn",
        "device": info.get("device"),
        "model": client.model_name,
        "dtype": info.get("dtype"),
        "tp": config.tp,
        "dp": config.dp,
        "routing": config.dp_routing,
        "cache": config.cache,
        "conversations": args.conversations,
        "turns": args.turns,
        "system_len": args.system_len,
        "user_len": args.user_len,
        "reply_len": args.reply_len,
        "ttft_ms_per_turn": ttft_ms,
        "last_turn_ttft_ms": ttft_ms[-1],
        "prefix_cache_hit_tokens": sum(per_replica),
        "replica_prefix_cache_hit_tokens": per_replica,
    }


async def _play(
    args: argparse.Namespace, client: FrontendClient, vocab_size: int
) -> tuple[list[float], int]:
    """The conversations' turns, all conversations at once, in a shuffled order each turn (as
    independent users arrive). A turn's prompt is the last one plus ``reply_len`` ids standing
    for the reply as the client sends it back, plus the new user message: the earlier prompt's
    KV is what a replica can have cached (the seed fixes every id, so both routings see the
    same prompts). Returns the mean TTFT of each turn and how many requests were sent."""
    rng = random.Random(0)
    top = min(vocab_size, 10000)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, top) for _ in range(n)]

    params = SamplingParams(max_tokens=args.reply_len, ignore_eos=True)
    # first-call costs, one short request per replica (no shared prefix: they spread out)
    await asyncio.gather(
        *(_first_token_s(client, ids(8), params) for _ in range(client.router.num_replicas))
    )
    system = ids(args.system_len)
    histories = [list(system) for _ in range(args.conversations)]
    ttft_ms = []
    for _turn in range(args.turns):
        prompts = [history + ids(args.user_len) for history in histories]
        order = list(range(args.conversations))
        rng.shuffle(order)
        firsts = await asyncio.gather(*(_first_token_s(client, prompts[c], params) for c in order))
        ttft_ms.append(round(1000 * sum(firsts) / len(firsts), 2))
        histories = [prompt + ids(args.reply_len) for prompt in prompts]
    return ttft_ms, client.router.num_replicas + args.turns * args.conversations


async def _first_token_s(
    client: FrontendClient, prompt: list[int], params: SamplingParams
) -> float:
    start = time.perf_counter()
    first = None
    async for reply in client.generate(GenerateRequest(params, input_ids=prompt)):
        if reply.error:
            raise RuntimeError(reply.error)
        if first is None:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def print_routed_table(rows: list[dict]) -> None:
    by_routing = {r["routing"]: r for r in rows}
    names = list(by_routing)
    print(f"{'turn':>4} " + " ".join(f"{name + ' TTFT ms':>22}" for name in names))
    for turn in range(len(rows[0]["ttft_ms_per_turn"])):
        print(
            f"{turn + 1:>4} "
            + " ".join(f"{by_routing[name]['ttft_ms_per_turn'][turn]:>22.1f}" for name in names)
        )
    for name, r in by_routing.items():
        print(
            f"{name}: prefix-cache hits {r['prefix_cache_hit_tokens']:,} tokens, per replica {r['replica_prefix_cache_hit_tokens']}"
        )
    print()
