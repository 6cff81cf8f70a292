"""Load: N concurrent streaming clients x M requests each, greedy, distinct prompts. Every stream is
well-formed and its text equals the non-streamed greedy reply to the same prompt; no 5xx. Prints
p50/p99 time to first token and total tokens/s (figures, not assertions)."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
from soak_utils import assert_idle, chat_body, load_prompts, run, stream_chat

FIGURES: dict[str, object] = {}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def test_concurrent_streams_are_well_formed_and_equal_greedy_replies(
    soak_server, scale, greedy_reference
):
    n = scale.clients * scale.requests_each
    prompts = load_prompts(n)
    results: dict[str, dict] = {}

    async def client_task(client: httpx.AsyncClient, i: int) -> None:
        for j in range(scale.requests_each):
            p = prompts[i * scale.requests_each + j]
            results[p] = await stream_chat(
                client, soak_server.url, chat_body(p, max_tokens=scale.max_tokens, temperature=0)
            )

    async def main() -> float:
        limits = httpx.Limits(
            max_connections=scale.clients + 4, max_keepalive_connections=scale.clients + 4
        )
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            t0 = time.perf_counter()
            await asyncio.gather(*(client_task(client, i) for i in range(scale.clients)))
            return time.perf_counter() - t0

    wall = run(main())
    reference = greedy_reference(prompts, scale.max_tokens)
    assert len(results) == n
    mismatches = [
        (p, r["text"], reference[p]) for p, r in results.items() if r["text"] != reference[p]
    ]
    assert not mismatches, mismatches[:3]
    ttfts = [r["ttft"] for r in results.values()]
    tokens = sum(r["tokens"] for r in results.values())
    FIGURES.update(
        profile=scale.name,
        streams=n,
        clients=scale.clients,
        wall_s=round(wall, 1),
        tokens=tokens,
        tokens_per_s=round(tokens / wall, 1),
        ttft_p50_s=round(percentile(ttfts, 0.5), 2),
        ttft_p99_s=round(percentile(ttfts, 0.99), 2),
        ttft_mean_s=round(statistics.mean(ttfts), 2),
    )
    print(f"\nSOAK LOAD {FIGURES}")
    assert_idle(soak_server)
