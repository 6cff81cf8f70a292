"""KV exhaustion: a server whose KV pool holds far less than the concurrent demand. Requests wait
(or are preempted and recomputed); none fails, all finish within a stated bound, and every output
equals the unconstrained greedy reply (from the big soak server)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from server_utils import ServerProcess
from soak_utils import assert_idle, chat_body, complete, load_prompts, run

SMALL_KV_TOKENS = 512
MAX_TOKENS = 48
BOUND_S = {"short": 240.0, "full": 900.0}
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", params=["radix", "naive"])
def small_server(request, scale, soak_server, tmp_path_factory):
    if request.param == "naive" and scale.name == "short":
        pytest.skip(
            "--cache naive under KV exhaustion runs in the full profile only (a server start costs ~25 s)"
        )
    # float32 weights like the soak server whose greedy replies it must repeat (tests/conftest.py, demo_server)
    srv = ServerProcess(
        "--max-kv-tokens",
        str(SMALL_KV_TOKENS),
        "--cache",
        request.param,
        "--quantization",
        "none",
        log_path=tmp_path_factory.mktemp("small-kv") / "serve.log",
    )
    srv.cache = request.param
    yield srv
    srv.stop()


def test_more_demand_than_the_pool_holds_all_finish_with_greedy_outputs(
    small_server, scale, greedy_reference
):
    prompts = load_prompts(scale.kv_requests, offset=1000)
    reference = greedy_reference(prompts, MAX_TOKENS, ignore_eos=True)
    total = small_server.metrics()["minisgl_kv_pages_total"]
    replies: dict[str, dict] = {}

    async def main() -> float:
        async with httpx.AsyncClient(timeout=BOUND_S[scale.name]) as client:

            async def one(p):
                replies[p] = await complete(
                    client,
                    small_server.url,
                    chat_body(p, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True),
                )

            t0 = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), BOUND_S[scale.name])
            return time.perf_counter() - t0

    wall = run(main())
    demand = sum(r["usage"]["total_tokens"] for r in replies.values())
    FIGURES[small_server.cache] = dict(
        profile=scale.name,
        requests=len(prompts),
        kv_tokens=int(total),
        demand_tokens=demand,
        wall_s=round(wall, 1),
        bound_s=BOUND_S[scale.name],
    )
    print(f"\nSOAK KV {FIGURES[small_server.cache]}")
    assert demand > total  # the premise: more concurrent demand than the pool holds
    for p in prompts:
        assert replies[p]["choices"][0]["finish_reason"] == "length"
        assert replies[p]["choices"][0]["message"]["content"] == reference[p], p
    assert_idle(small_server)


def test_max_tokens_beyond_the_room_is_clamped_with_finish_length(small_server):
    """max_tokens far beyond what the context / KV pool leaves: clamped, finish_reason "length"."""
    prompt = "Repeat: " + "ok " * 440
    r = httpx.post(
        f"{small_server.url}/v1/chat/completions",
        json=chat_body(prompt, max_tokens=10**6, ignore_eos=True, temperature=0),
        timeout=600,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == SMALL_KV_TOKENS
    assert_idle(small_server)
