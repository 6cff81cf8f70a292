"""Overlap scheduling (launch step N+1 before reading step N's tokens) must change nothing a user
sees: the same tokens and finish reasons as the plain loop, through chunked prefill, stop tokens,
max_tokens, preemption, seeds and aborts; and every page comes back.

The overlap loop is meant for CUDA, but its bookkeeping is device-independent, so these tests
force it on in the CPU engine (the GPU itself is covered by tests/gpu/test_cuda.py)."""

from __future__ import annotations

import random

import pytest
from tiny_models import TINY

from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams


def prompts(n: int, seed: int, lo: int = 3, hi: int = 90) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(2, TINY["vocab_size"]) for _ in range(rng.randrange(lo, hi))]
        for _ in range(n)
    ]


def run(llm: LLM, overlap: bool, ids, params) -> list[tuple[list[int], str]]:
    llm.scheduler.overlap = overlap
    out = [(r.token_ids, r.finish_reason) for r in llm.generate(ids, params)]
    assert llm.scheduler.in_flight is None and not llm.scheduler.has_work
    assert_all_pages_back(llm)
    return out


def assert_all_pages_back(llm: LLM) -> None:
    kv = llm.scheduler.cache_manager.stats()
    assert kv.used == 0 and kv.used + kv.cached + kv.free == kv.total
    assert llm.engine.page_table.num_free_rows == llm.scheduler.max_running_requests


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def llm(request, tiny_model):
    folder, _ = tiny_model(request.param)
    return LLM(
        str(folder), device="cpu", max_kv_tokens=4096, max_prefill_tokens=40, max_running_requests=8
    )


def test_greedy_outputs_equal_the_plain_loop(llm):
    ids = prompts(12, seed=1)  # more requests than running slots; long ones are chunked
    params = [SamplingParams(max_tokens=n) for n in (1, 2, 3, 7, 20, 33, 1, 5, 16, 2, 40, 9)]
    plain = run(llm, False, ids, params)
    assert run(llm, True, ids, params) == plain
    for (tokens, reason), p in zip(
        plain, params
    ):  # "length" exactly at max_tokens; else an EOS ended it
        assert reason in ("length", "stop") and 0 < len(tokens) <= p.max_tokens, (
            reason,
            len(tokens),
            p.max_tokens,
        )
        assert reason == "stop" or len(tokens) == p.max_tokens, (reason, len(tokens), p.max_tokens)


def test_stop_tokens_end_at_the_same_place(llm):
    ids = prompts(8, seed=2)
    free_run = run(llm, False, ids, SamplingParams(max_tokens=24, ignore_eos=True))
    # stop each request at a token it really produces mid-way, so the stop lands while the next
    # step is already in flight
    params = [
        SamplingParams(max_tokens=24, stop_token_ids=[toks[len(toks) // 2]]) for toks, _ in free_run
    ]
    plain = run(llm, False, ids, params)
    assert any(reason == "stop" for _, reason in plain)
    assert run(llm, True, ids, params) == plain


def test_seeded_sampling_is_unchanged(llm):
    ids = prompts(6, seed=3)
    params = [
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=100 + i) for i in range(6)
    ]
    assert run(llm, True, ids, params) == run(llm, False, ids, params)


def test_preemption_under_a_small_kv_pool(tiny_model):
    folder, _ = tiny_model("qwen3")
    ids = prompts(6, seed=4, lo=20, hi=30)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    roomy = LLM(str(folder), device="cpu", max_kv_tokens=4096, max_running_requests=8)
    tight = LLM(
        str(folder), device="cpu", max_kv_tokens=120, max_prefill_tokens=32, max_running_requests=8
    )
    expected = run(roomy, False, ids, params)
    assert run(tight, True, ids, params) == expected
    assert run(tight, False, ids, params) == expected


def test_aborts_at_every_stage_return_every_page(llm):
    sched = llm.scheduler
    sched.overlap = True
    ids = prompts(10, seed=5, lo=30, hi=120)
    uids = list(range(1000, 1010))
    for uid, toks in zip(uids, ids):
        sched.add_request(uid, toks, SamplingParams(max_tokens=50, ignore_eos=True))
    finished: dict[int, str] = {}
    rng = random.Random(0)
    steps = 0
    while sched.has_work:
        for out in sched.step():
            if out.finished:
                finished[out.uid] = out.finish_reason.value
        steps += 1
        live = [uid for uid in uids if uid in sched.reqs]
        if live and rng.random() < 0.3:  # waiting, mid chunked prefill or decoding
            out = sched.abort_request(rng.choice(live))
            finished[out.uid] = out.finish_reason.value
    assert set(finished) == set(uids)
    assert "abort" in finished.values()
    assert_all_pages_back(llm)
