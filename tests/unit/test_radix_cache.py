"""The radix prefix cache: the tree alone (examples, then random programs checked against our own
ownership books), then through the engine on a tiny real model: greedy outputs identical to the
naive cache, eviction under a small pool, aborts that insert only computed KV."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl_engine.kvcache import KVStats, PageAllocator, PrefixMatch, RadixCacheManager
from minisgl_engine.sampling_params import SamplingParams

VOCAB = 320  # the tiny model's


def radix(num_pages: int, page_size: int = 1) -> RadixCacheManager:
    return RadixCacheManager(PageAllocator(num_pages), page_size)


def serve(cache: RadixCacheManager, tokens: list[int], computed: int | None = None) -> PrefixMatch:
    """Admit a request for ``tokens``, pretend ``computed`` tokens (default all) got their KV,
    and release it: the scheduler's admission and finish path, without a model."""
    match = cache.match_prefix(tokens)
    need = -(-len(tokens) // cache.page_size) - len(match.pages)
    pages = match.pages + cache.alloc_pages(need)
    cache.release(tokens, len(tokens) if computed is None else computed, pages, match)
    return match


# ---- the tree alone: examples ---------------------------------------------------------------


def test_match_never_covers_the_last_prompt_token() -> None:
    cache = radix(16)
    serve(cache, [1, 2, 3, 4])
    assert cache.match_prefix([1, 2, 3, 4]).length == 3  # the last token must be computed
    assert cache.match_prefix([1, 2, 3, 4, 5]).length == 4
    assert cache.match_prefix([1]).length == 0


def test_only_whole_computed_pages_are_cached() -> None:
    cache = radix(16, page_size=4)
    serve(cache, list(range(10)), computed=7)  # pages 0..3 whole; 4..6 a partial page
    assert cache.stats() == KVStats(total=16, used=0, cached=1, free=15)
    assert cache.match_prefix(list(range(20))).length == 4


def test_locked_prefix_counts_as_used_and_survives_eviction() -> None:
    cache = radix(8)
    serve(cache, [1, 2, 3, 4])
    serve(cache, [9, 9, 9])
    match = cache.match_prefix([1, 2, 3, 4, 5])
    assert match.length == 4
    assert cache.stats() == KVStats(total=8, used=4, cached=3, free=1)
    assert cache.evict(8) == 3  # only the unlocked [9, 9, 9]
    assert cache.alloc_pages(5) is None  # 4 free, nothing evictable
    cache.release([1, 2, 3, 4, 5], 4, match.pages, match)
    assert cache.stats() == KVStats(total=8, used=0, cached=4, free=4)


def test_split_on_a_partial_match_keeps_page_ownership() -> None:
    cache = radix(16, page_size=2)
    serve(cache, [1, 2, 3, 4, 5, 6])
    (node,) = cache.nodes()
    whole = list(node.pages)
    match = cache.match_prefix([1, 2, 3, 4, 7, 8, 9])  # matches [1 2 | 3 4], then differs
    assert match.length == 4 and match.pages == whole[:2]
    upper, lower = sorted(cache.nodes(), key=lambda n: len(n.key), reverse=True)
    assert (upper.key, upper.pages, upper.ref) == ([1, 2, 3, 4], whole[:2], 1)
    assert (lower.key, lower.pages, lower.ref, lower.parent) == ([5, 6], whole[2:], 0, upper)
    assert cache.stats() == KVStats(total=16, used=2, cached=1, free=13)
    pages = match.pages + cache.alloc_pages(2)
    cache.release([1, 2, 3, 4, 7, 8, 9], 7, pages, match)  # [7, 8] cached, [9] freed
    assert cache.stats() == KVStats(total=16, used=0, cached=4, free=12)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 0]).pages == whole


def test_a_prefix_computed_twice_is_kept_once() -> None:
    cache = radix(16)
    a, b = cache.match_prefix([5, 6, 7, 8]), cache.match_prefix([5, 6, 7, 8])  # both miss
    pages_a, pages_b = cache.alloc_pages(4), cache.alloc_pages(4)
    cache.release([5, 6, 7, 8], 4, pages_a, a)
    cache.release([5, 6, 7, 8], 4, pages_b, b)  # the same KV again: its pages are freed
    assert cache.stats() == KVStats(total=16, used=0, cached=4, free=12)
    assert cache.match_prefix([5, 6, 7, 8, 9]).pages == pages_a


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    cache = radix(8)
    serve(cache, [1, 1])
    serve(cache, [2, 2])
    serve(cache, [3, 3])
    cache.release([], 0, [], cache.match_prefix([1, 1, 0]))  # touch [1, 1]
    assert cache.evict(1) == 2  # [2, 2]: a whole leaf
    assert sorted(n.key for n in cache.nodes()) == [[1, 1], [3, 3]]
    assert cache.alloc_pages(6) is not None  # 4 free + [3, 3] evicted; [1, 1] kept
    assert [n.key for n in cache.nodes()] == [[1, 1]]


def test_failed_admission_unlocks_its_prefix() -> None:
    cache = radix(4)
    serve(cache, [1, 2, 3])
    match = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert cache.alloc_pages(3) is None  # only 1 free; the locked prefix cannot be evicted
    cache.release([], 0, [], match)
    assert cache.stats() == KVStats(total=4, used=0, cached=3, free=1)


# ---- the tree alone: random programs --------------------------------------------------------

# Prompts are a cut of one of two stems plus a few tokens, so they often share prefixes. An op
# is (kind, a, b, extra tokens); admitting and finishing come up twice as often as the others.
STEMS = st.lists(st.lists(st.integers(0, 3), min_size=12, max_size=12), min_size=2, max_size=2)
KINDS = ["admit", "admit", "finish", "finish", "compute", "decode", "abort", "evict"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 99),
        st.integers(1, 16),
        st.lists(st.integers(0, 3), max_size=4),
    ),
    min_size=20,
    max_size=60,
)


class Live:
    def __init__(self, tokens: list[int], match: PrefixMatch, pages: list[int]) -> None:
        self.tokens, self.match, self.pages, self.cached_len = tokens, match, pages, match.length

    @property
    def own(self) -> list[int]:
        return self.pages[len(self.match.pages) :]


class Books:
    """What the test knows independently of the manager: which live request holds which pages,
    and what KV every page holds (position of its page, tokens written)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.cache = radix(num_pages, page_size)
        self.ps = page_size
        self.live: list[Live] = []
        self.kv: dict[int, tuple[int, tuple[int, ...]]] = {}

    def compute(self, req: Live, n: int) -> None:
        """The forward pass writes KV for the next ``n`` tokens, into the request's own pages."""
        end = min(req.cached_len + n, len(req.tokens))
        for pos in range(req.cached_len, end):
            page_index = pos // self.ps
            assert page_index >= len(req.match.pages), "would overwrite a shared cached page"
            start = page_index * self.ps
            self.kv[req.pages[page_index]] = (page_index, tuple(req.tokens[start : pos + 1]))
        req.cached_len = end

    def check(self) -> None:
        cache, ps = self.cache, self.ps
        total = cache.allocator.num_pages
        free = list(cache.allocator._free)
        expected_ref: dict[int, int] = {}
        for req in self.live:
            node = req.match.handle
            while node is not None and node is not cache.root:
                expected_ref[id(node)] = expected_ref.get(id(node), 0) + 1
                node = node.parent
        tree: list[int] = []
        locked = cached = 0
        stack = [(cache.root, 0)]
        while stack:
            node, depth = stack.pop()
            for first, child in node.children.items():
                assert child.parent is node and first == tuple(child.key[:ps])
                assert (
                    child.key
                    and len(child.key) % ps == 0
                    and len(child.pages) * ps == len(child.key)
                )
                assert child.ref == expected_ref.get(id(child), 0) >= 0
                for i, page in enumerate(child.pages):  # the tree holds only whole, correct KV
                    assert self.kv.get(page) == (
                        depth // ps + i,
                        tuple(child.key[i * ps : (i + 1) * ps]),
                    )
                tree += child.pages
                if child.ref:
                    locked += len(child.pages)
                else:
                    cached += len(child.pages)
                stack.append((child, depth + len(child.key)))
        own = [p for req in self.live for p in req.own]
        owners = free + tree + own
        assert len(owners) == len(set(owners)) == total, "a page has two owners, or none"
        for req in self.live:
            assert set(req.match.pages) <= set(tree), "a locked prefix left the tree"
        assert cache.stats() == KVStats(
            total=total, used=len(own) + locked, cached=cached, free=len(free)
        )
        assert cache.available_pages() == len(free) + cached

    def run(self, stems: list[list[int]], op: tuple) -> None:
        cache, ps = self.cache, self.ps
        kind, a, b, extra = op
        if kind == "admit":
            tokens = stems[a % 2][: b % 13] + extra or [0]
            match = cache.match_prefix(tokens)
            assert (
                match.length % ps == 0
                and match.length <= len(tokens) - 1
                and len(match.pages) * ps == match.length
            )
            for i, page in enumerate(match.pages):
                assert self.kv[page] == (i, tuple(tokens[i * ps : (i + 1) * ps]))
            need = -(-len(tokens) // ps) - len(match.pages)
            available = cache.available_pages()
            pages = cache.alloc_pages(need)
            if pages is None:
                assert need > available
                cache.release([], 0, [], match)
            else:
                self.live.append(Live(tokens, match, match.pages + pages))
        elif kind == "evict":
            n = b % 10
            before = cache.stats()
            freed = cache.evict(n)
            after = cache.stats()
            assert freed >= min(n, before.cached) and after.cached == before.cached - freed
            assert after.free == before.free + freed and after.used == before.used
        elif self.live:
            req = self.live[a % len(self.live)]
            if kind == "compute":
                self.compute(req, b)
            elif kind == "decode" and req.cached_len == len(req.tokens):  # the sampled token
                req.tokens.append(b % 4)
                if len(req.tokens) > len(req.pages) * ps:
                    page = cache.alloc_pages(1)
                    if page is None:
                        req.tokens.pop()
                        return
                    req.pages += page
            elif kind in ("finish", "abort"):
                if kind == "finish":
                    self.compute(req, len(req.tokens))
                self.live.remove(req)
                cache.release(req.tokens, req.cached_len, req.pages, req.match)
        for page in cache.allocator._free:
            self.kv.pop(page, None)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40), st.sampled_from([1, 2, 4]), STEMS, OPS)
def test_random_programs_keep_one_owner_per_page(num_pages, page_size, stems, program) -> None:
    """match + lock (admit) / compute / decode / insert + unlock (finish, abort) / evict in any
    order: every page is free, a live request's or the tree's, never two of them; refcounts are
    exactly the live requests through a node; eviction never frees a locked node; the tree
    holds only whole pages of correct KV; used + cached + free == total."""
    books = Books(num_pages, page_size)
    books.check()
    for op in program:
        books.run(stems, op)
        books.check()
    while books.live:
        books.run(stems, ("abort", 0, 0, []))
        books.check()
    assert books.cache.stats().used == 0
    books.cache.evict(num_pages)
    assert books.cache.stats() == KVStats(total=num_pages, used=0, cached=0, free=num_pages)


# ---- through the engine ---------------------------------------------------------------------


def make_llm(folder, cache: str, **kw):
    from minisgl_engine.llm import LLM

    args = dict(
        device="cpu",
        max_kv_tokens=2048,
        page_size=1,
        max_prefill_tokens=64,
        max_running_requests=8,
        cache=cache,
    )
    args.update(kw)
    return LLM(str(folder), **args)


def assert_books_balance(llm) -> KVStats:
    kv = llm.scheduler.cache_manager.stats()
    assert kv.used + kv.cached + kv.free == kv.total
    return kv


def chat(llm, conversations: int, turns: int, reply_len: int = 6, seed: int = 0) -> list[list[int]]:
    """Conversations over one system prompt; each turn resends the history plus a new message.
    Returns every conversation's final history (prompts and greedy replies)."""
    rng = random.Random(seed)
    system = [rng.randrange(2, VOCAB) for _ in range(20)]
    histories = [list(system) for _ in range(conversations)]
    params = SamplingParams(max_tokens=reply_len, ignore_eos=True)
    for _ in range(turns):
        prompts = [
            h + [rng.randrange(2, VOCAB) for _ in range(rng.randrange(1, 9))] for h in histories
        ]
        results = llm.generate(prompts, params)
        histories = [p + r.token_ids for p, r in zip(prompts, results)]
        kv = assert_books_balance(llm)
        assert kv.used == 0
    return histories


@pytest.fixture(scope="module")
def tiny_dir(tiny_model):
    folder, _ = tiny_model("llama")
    return folder


@pytest.fixture(scope="module")
def naive_chats(tiny_dir) -> list[list[int]]:
    return chat(make_llm(tiny_dir, "naive"), conversations=4, turns=3)


@pytest.mark.parametrize("page_size", [1, 4])
def test_multiturn_greedy_output_equals_naive(tiny_dir, naive_chats, page_size) -> None:
    llm = make_llm(tiny_dir, "radix", page_size=page_size)
    assert chat(llm, conversations=4, turns=3) == naive_chats
    stats = llm.scheduler.stats()
    # turns 2 and 3 at least reuse the previous prompt of each conversation
    assert stats.prefix_cache_hit_tokens_total >= 4 * 2 * (20 - page_size)
    assert stats.kv_pages_cached > 0 and stats.kv_pages_used == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_small_pool_evicts_and_outputs_stay_identical(tiny_dir, naive_chats, page_size) -> None:
    # the four histories grow to ~145 distinct tokens: turns must evict (and wait for) others
    llm = make_llm(tiny_dir, "radix", page_size=page_size, max_kv_tokens=96)
    cache = llm.scheduler.cache_manager
    evicted = []
    evict = cache.evict
    cache.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    assert chat(llm, conversations=4, turns=3) == naive_chats
    assert sum(evicted) > 0
    assert llm.scheduler.stats().kv_pages_used == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_abort_mid_prefill_caches_only_computed_pages(tiny_dir, page_size) -> None:
    llm = make_llm(tiny_dir, "radix", page_size=page_size, max_prefill_tokens=16)
    sched = llm.scheduler
    prompt = [random.Random(3).randrange(2, VOCAB) for _ in range(50)]
    sched.add_request(1, prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    assert sched.step() == []  # the first 16-token chunk
    sched.abort_request(1)
    kv = assert_books_balance(llm)
    assert kv.used == 0 and kv.cached * page_size == 16
    match = sched.cache_manager.match_prefix(prompt)
    assert match.length == 16
    sched.cache_manager.release([], 0, [], match)
    # what was cached is correct KV: the same prompt now gives the naive engine's tokens
    expected = (
        make_llm(tiny_dir, "naive")
        .generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))[0]
        .token_ids
    )
    assert (
        llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids
        == expected
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_abort_mid_decode_caches_at_most_what_was_computed(tiny_dir, page_size) -> None:
    llm = make_llm(tiny_dir, "radix", page_size=page_size)
    sched = llm.scheduler
    prompt = [random.Random(4).randrange(2, VOCAB) for _ in range(13)]
    sched.add_request(1, prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    generated = [out.token_id for _ in range(5) for out in sched.step()]
    req = sched.reqs[1]
    assert req.cached_len == 13 + 4 and req.seq_len == 18  # the newest token has no KV yet
    sched.abort_request(1)
    kv = assert_books_balance(llm)
    assert kv.used == 0 and kv.cached * page_size == 17 // page_size * page_size
    full = prompt + generated
    match = sched.cache_manager.match_prefix(full + [7])
    assert match.length == 17 // page_size * page_size
    sched.cache_manager.release([], 0, [], match)
    assert assert_books_balance(llm).used == 0
