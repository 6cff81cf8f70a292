"""A CPU KV pool costs memory only where requests wrote it, and gives free pages' memory back to
the OS when the scheduler is idle; a request after a release computes what it computed before."""

from __future__ import annotations

import mmap
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import TINY

from minisgl_engine.kvcache import KVPool, PageAllocator
from minisgl_engine.sampling_params import SamplingParams

LAYERS, HEADS, DIM = 3, 2, 64  # a slot is 256 bytes a layer in float16: 16 slots an OS page


def pool_of(num_pages: int, page_size: int = 1, dtype: torch.dtype = torch.float16) -> KVPool:
    return KVPool(LAYERS, num_pages, page_size, HEADS, DIM, dtype, "cpu")


def write(pool: KVPool, slots: list[int], value: float) -> None:
    kv = torch.full((len(slots), HEADS, DIM), value)
    for layer in range(LAYERS):
        pool.store(layer, torch.tensor(slots), kv, kv)


@pytest.mark.skipif(
    KVPool(1, 1, 1, 1, 16, torch.float16, "cpu").resident_bytes() is None, reason="no mincore here"
)
def test_a_cpu_pool_is_resident_only_where_written_and_released_when_free() -> None:
    slot_bytes = HEADS * DIM * 2
    pool = pool_of(4096)
    assert pool.resident_bytes() == 0
    write(pool, list(range(1024)), 1.5)
    written = 2 * LAYERS * 1024 * slot_bytes  # K and V of every layer
    assert written <= pool.resident_bytes() <= written + 2 * LAYERS * 2 * mmap.PAGESIZE
    assert pool.release([(0, 4096)]) > 0
    assert pool.resident_bytes() == 0
    assert bool((pool.k_cache == 0).all()) and bool(
        (pool.v_cache == 0).all()
    )  # a released page reads as zeros


def test_release_keeps_the_pages_in_use_and_only_whole_os_pages_go() -> None:
    pool = pool_of(512)
    write(pool, list(range(512)), 2.0)
    # slots 0..39 and 100..511 free; 40..99 held. In layer 0 (which starts on an OS page) the OS
    # page of slots 32..47 holds held slots too, so it stays, and so does that of 96..111
    pool.release([(0, 40), (100, 512)])
    k, v = pool.k_cache.float(), pool.v_cache.float()
    assert bool((k[:, 40:100] == 2.0).all()) and bool((v[:, 40:100] == 2.0).all())
    assert bool((k[0, :32] == 0).all()) and bool((k[0, 32:40] == 2.0).all())
    assert bool((k[0, 100:112] == 2.0).all()) and bool((k[0, 112:512] == 0).all())
    assert bool((k[1:, 112:512] == 0).all()) and bool((v[1:, 112:512] == 0).all())


@pytest.mark.parametrize("page_size", [1, 4])
def test_release_in_whole_pages_of_tokens(page_size: int) -> None:
    pool = pool_of(64, page_size)
    write(pool, list(range(64 * page_size)), 3.0)
    pool.release([(16, 48)])  # pages 16..47: slots 16 * page_size .. 48 * page_size
    k = pool.k_cache.float()
    assert bool((k[0, 16 * page_size : 48 * page_size] == 0).all())  # layer 0 starts on an OS page
    assert bool((k[:, : 16 * page_size] == 3.0).all()) and bool(
        (k[:, 48 * page_size : 64 * page_size] == 3.0).all()
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=80))
def test_free_runs_are_exactly_the_free_pages(taken: list[bool]) -> None:
    allocator = PageAllocator(len(taken))
    pages = allocator.alloc(len(taken))
    allocator.free([p for p, t in zip(pages, taken) if not t])
    runs = allocator.free_runs()
    assert all(a < b for a, b in runs) and all(b1 < a2 for (_, b1), (a2, _) in zip(runs, runs[1:]))
    assert sorted(p for a, b in runs for p in range(a, b)) == [
        p for p, t in enumerate(taken) if not t
    ]


def test_a_gpu_style_pool_has_nothing_to_release() -> None:
    """Only the CPU pool is a mapping; release on another pool is a no-op (checked with a
    meta-device pool: no memory at all)."""
    pool = KVPool(LAYERS, 16, 1, HEADS, DIM, torch.float16, "meta")
    assert not pool.releasable and pool.release([(0, 16)]) == 0 and pool.resident_bytes() is None


# ---- the scheduler's idle release, on a tiny real model ----


def random_prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, TINY["vocab_size"]) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def llm(tiny_model):
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model("llama3")
    return LLM(str(folder), device="cpu", max_kv_tokens=8192, max_prefill_tokens=64)


GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("evict_cache", [False, True])
def test_requests_after_an_idle_release_give_the_same_greedy_tokens(llm, evict_cache: bool) -> None:
    prompts = random_prompts([150, 40, 90], seed=3 + evict_cache)
    before = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    sched, pool = llm.scheduler, llm.engine.kv_pool
    resident = pool.resident_bytes()
    assert resident > 0
    assert sched.release_idle_memory(evict_cache) > 0
    kv = sched.cache_manager.stats()
    if evict_cache:
        assert kv.cached == 0 and kv.free == kv.total
        assert pool.resident_bytes() == 0
    else:  # the prefix cache keeps its pages, and their K/V
        assert kv.cached > 0 and 0 < pool.resident_bytes() <= resident
    hits = sched.prefill_manager.prefix_hit_tokens
    after = [r.token_ids for r in llm.generate(prompts, GREEDY)]
    assert after == before
    assert (sched.prefill_manager.prefix_hit_tokens > hits) != evict_cache


def test_no_release_while_requests_are_live(llm) -> None:
    sched = llm.scheduler
    [prompt] = random_prompts([30], seed=9)
    sched.add_request(10_001, prompt, SamplingParams(max_tokens=4, temperature=0))
    try:
        assert sched.release_idle_memory(True) == 0
    finally:
        while sched.reqs:
            sched.step()


def test_the_idle_worker_releases_free_pages_then_the_prefix_cache(llm, monkeypatch) -> None:
    """The scheduler worker's wait: nothing for IDLE_RELEASE_S releases free pages only; nothing
    for IDLE_CACHE_EVICT_S evicts the prefix cache too; then it blocks without a limit."""
    from minisgl_engine.workers import scheduler_worker

    calls: list[tuple[bool, int | None]] = []

    class SilentReceiver:
        def recv_all(self, block: bool, timeout_ms: int | None = None) -> list:
            calls.append((block, timeout_ms))
            return []

    released: list[bool] = []
    monkeypatch.setattr(
        llm.scheduler, "release_idle_memory", lambda evict_cache: released.append(evict_cache) or 0
    )
    monkeypatch.setattr(scheduler_worker, "IDLE_RELEASE_S", 0.25)
    monkeypatch.setattr(scheduler_worker, "IDLE_CACHE_EVICT_S", 2.0)
    worker = scheduler_worker.SchedulerWorker.__new__(scheduler_worker.SchedulerWorker)
    worker.scheduler, worker.receiver = llm.scheduler, SilentReceiver()
    worker.push_stats = lambda: None
    assert worker._wait_idle() == []
    assert calls == [(True, 250), (True, 1750), (True, None)]
    assert released == [False, True]
