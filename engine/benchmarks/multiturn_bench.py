"""``bench multiturn``: chats that resend their history every turn, on one engine with the radix
prefix cache and one without, turn by turn."""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from .common import row_header, sync_device


def time_turn(
    llm, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[float], list[list[int]]]:
    """One turn of every conversation at once: (seconds to each one's first token, replies)."""
    sync_device(llm.engine.device)
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
    return [
        {
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
        }
        for cache, llm in llms.items()
    ]


def play_multiturn(
    args: argparse.Namespace, llms: dict
) -> tuple[dict[str, list[float]], dict[str, float], dict[str, list[list[int]]]]:
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
        print(
            f"{turn:>4} {radix:>14.1f} {naive:>14.1f} {radix / naive if naive else float('nan'):>12.2f}"
        )
    regen = {r["cache"]: r["regenerate_ttft_ms"] for r in rows}
    print(
        f"{'regenerate last reply':>21}: radix {regen['radix']:.1f} ms, naive (cold) {regen['naive']:.1f} ms"
    )
    print(
        f"greedy replies identical under both caches: {'yes' if rows[0]['replies_identical'] else 'NO'}"
    )
    print()
