"""KV pages: the allocator, the naive cache manager and the page table in isolation, then the
scheduler's promise that every way a request ends gives its pages back, on a tiny real model."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl_engine.errors import RequestError
from minisgl_engine.kvcache import KVStats, NaiveCacheManager, PageAllocator, PageTable
from minisgl_engine.sampling_params import SamplingParams

CONTEXT = 512  # max_position_embeddings of the tiny model
VOCAB = 320


# ---- PageAllocator / NaiveCacheManager ------------------------------------------------------


def test_allocator_hands_out_distinct_pages_and_takes_them_back() -> None:
    alloc = PageAllocator(8)
    assert alloc.num_free == 8
    a, b = alloc.alloc(3), alloc.alloc(5)
    assert len(a) == 3 and len(b) == 5
    assert sorted(a + b) == list(range(8))
    assert alloc.num_free == 0
    with pytest.raises(MemoryError):
        alloc.alloc(1)
    alloc.free(a)
    assert alloc.num_free == 3
    assert sorted(alloc.alloc(3)) == sorted(a)
    assert alloc.alloc(0) == []


def test_allocator_refuses_more_than_it_has_without_losing_pages() -> None:
    alloc = PageAllocator(4)
    held = alloc.alloc(2)
    with pytest.raises(MemoryError):
        alloc.alloc(3)
    assert alloc.num_free == 2
    assert sorted(alloc.alloc(2) + held) == [0, 1, 2, 3]


def test_double_free_raises() -> None:
    alloc = PageAllocator(4)
    pages = alloc.alloc(2)
    alloc.free(pages)
    with pytest.raises(AssertionError):
        alloc.free(pages)
    with pytest.raises(AssertionError):
        alloc.free([3])  # never handed out
    assert alloc.num_free == 4


def test_rejected_free_leaves_the_allocator_unchanged() -> None:
    alloc = PageAllocator(4)
    pages = alloc.alloc(2)
    with pytest.raises(AssertionError):
        alloc.free([pages[0], pages[0]])
    # pages are still in use; freeing them properly must bring back all four
    alloc.free(pages)
    assert alloc.num_free == 4
    assert sorted(alloc.alloc(4)) == [0, 1, 2, 3]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 12)),
        st.tuples(st.just("raw_alloc"), st.integers(0, 12)),
        st.tuples(st.just("release"), st.integers(0, 1000)),
        st.tuples(st.just("double_free"), st.integers(0, 1000)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 24), st.sampled_from([1, 4, 16]), ops)
def test_random_alloc_free_never_shares_a_page_and_keeps_the_books(
    num_pages, page_size, program
) -> None:
    allocator = PageAllocator(num_pages)
    manager = NaiveCacheManager(allocator, page_size)
    owned: list[list[int]] = []  # live groups of pages
    released: list[list[int]] = []  # groups given back (their pages may have new owners since)

    def check() -> None:
        held = [p for group in owned for p in group]
        assert len(held) == len(set(held)), "a page has two owners"
        assert all(0 <= p < num_pages for p in held)
        s = manager.stats()
        assert isinstance(s, KVStats)
        assert s.used + s.cached + s.free == s.total == num_pages
        assert s.used == len(held) and s.cached == 0
        assert s.free == allocator.num_free == manager.available_pages() == num_pages - len(held)

    check()
    for op, arg in program:
        free_before = allocator.num_free
        if op == "alloc":
            match = manager.match_prefix(list(range(arg * page_size)))
            assert match.pages == [] and match.length == 0  # the naive manager caches nothing
            pages = manager.alloc_pages(arg)
            if arg > free_before:
                assert pages is None
            else:
                assert pages is not None and len(pages) == arg
                owned.append(pages)
        elif op == "raw_alloc":
            if arg > free_before:
                with pytest.raises(MemoryError):
                    allocator.alloc(arg)
            else:
                owned.append(allocator.alloc(arg))
        elif op == "release" and owned:
            group = owned.pop(arg % len(owned))
            manager.release(
                list(range(len(group) * page_size)), len(group) * page_size, group, None
            )
            released.append(group)
        elif op == "double_free":
            held = {p for g in owned for p in g}
            stale = [g for g in released if g and not held & set(g)]  # pages all still free
            if stale:
                with pytest.raises(AssertionError):
                    allocator.free(stale[arg % len(stale)])
        check()
    for group in owned:
        manager.release([], 0, group, None)
    assert manager.stats() == KVStats(total=num_pages, used=0, cached=0, free=num_pages)


# ---- PageTable ------------------------------------------------------------------------------


def test_page_table_rows_are_distinct_and_reusable() -> None:
    table = PageTable(3, 16, torch.device("cpu"))
    rows = [table.alloc_row() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2]
    table.free_row(rows[1])
    assert table.alloc_row() == rows[1]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.data())
def test_write_pages_maps_each_position_to_its_slot(page_size, data) -> None:
    max_len = data.draw(st.integers(1, 64))
    table = PageTable(2, max_len, torch.device("cpu"), page_size)
    row = table.alloc_row()
    other = table.alloc_row()
    table.table[other] = -7  # must stay untouched
    n_req_pages = -(-max_len // page_size)
    pages = data.draw(
        st.lists(st.integers(0, 200), min_size=n_req_pages, max_size=n_req_pages, unique=True)
    )
    split = data.draw(st.integers(0, n_req_pages))
    # a prompt's pages first, then the pages grown during decode
    table.write_pages(row, 0, pages[:split])
    table.write_pages(row, split, pages[split:])
    table.write_pages(row, n_req_pages, [])  # nothing to write
    table.apply(*(torch.tensor(part, dtype=torch.int64) for part in table.take_pending()))
    expected = [pages[pos // page_size] * page_size + pos % page_size for pos in range(max_len)]
    assert table.table[row, :max_len].tolist() == expected
    assert bool((table.table[other] == -7).all())


# ---- the scheduler on a tiny real model -----------------------------------------------------


def _save_tiny_llama(folder, eos_token_id: int = 1) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        eos_token_id=eos_token_id,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # larger-than-default weights: logits with real spread, no near-ties
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(0, 0.08)
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    _save_tiny_llama(folder)
    return folder


def make_llm(folder, **kw):
    from minisgl_engine.llm import LLM

    args = dict(
        device="cpu",
        max_kv_tokens=4096,
        page_size=1,
        max_prefill_tokens=256,
        max_running_requests=8,
    )
    args.update(kw)
    return LLM(str(folder), **args)


def prompts_of(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(n)] for n in lengths]


def assert_books_balance(llm) -> KVStats:
    kv = llm.scheduler.cache_manager.stats()
    assert kv.used + kv.cached + kv.free == kv.total
    return kv


def assert_all_pages_free(llm) -> None:
    kv = assert_books_balance(llm)
    assert kv.used == 0, kv
    assert kv.free + kv.cached == kv.total
    assert not llm.scheduler.reqs


def drain(llm, outputs=None, max_steps=5000):
    """Step until the scheduler is idle, checking the page books every step."""
    outputs = {} if outputs is None else outputs
    sched = llm.scheduler
    for _ in range(max_steps):
        if not sched.reqs:
            return outputs
        for out in sched.step():
            toks, _ = outputs.get(out.uid, ([], None))
            if out.token_id is not None:
                toks.append(out.token_id)
            outputs[out.uid] = (toks, out.finish_reason.value if out.finished else None)
        assert_books_balance(llm)
    raise AssertionError("the scheduler did not finish its requests")


GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """Greedy outputs of an unconstrained engine for a fixed set of prompts."""
    prompts = prompts_of([8, 5, 11, 8, 3, 9], seed=1)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    results = make_llm(tiny_dir).generate(prompts, params)
    assert all(r.finish_reason == "length" and len(r.token_ids) == 24 for r in results)
    return prompts, params, [r.token_ids for r in results]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_generate_returns_every_page(tiny_dir, page_size) -> None:
    llm = make_llm(tiny_dir, page_size=page_size, max_kv_tokens=512, max_prefill_tokens=32)
    total = llm.scheduler.cache_manager.stats().total
    assert total == -(-512 // page_size)
    prompts = prompts_of([1, 7, 16, 17, 45, 3])  # 45 > the prefill budget: chunked
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 5, 9, 16, 3, 20)]
    results = llm.generate(prompts, params)
    assert [len(r.token_ids) for r in results] == [1, 5, 9, 16, 3, 20]
    assert all(r.finish_reason == "length" for r in results)
    assert_all_pages_free(llm)
    llm.scheduler.cache_manager.evict(total)  # what the prefix cache kept comes back too
    assert llm.scheduler.cache_manager.stats().free == total
    # and again, with sampling and stops, on the same engine
    results = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=3))
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert_all_pages_free(llm)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_batched_chunked_greedy_output_equals_the_reference(tiny_dir, reference, page_size) -> None:
    prompts, params, expected = reference
    llm = make_llm(tiny_dir, page_size=page_size, max_prefill_tokens=7)  # most prompts chunked
    assert [r.token_ids for r in llm.generate(prompts, params)] == expected
    assert_all_pages_free(llm)


def test_a_long_cpu_prompt_reads_a_short_first_chunk_then_full_ones(tiny_dir) -> None:
    """The first chunk of a prompt that needs several is FIRST_PREFILL_CHUNK_CPU tokens, so the
    page's "reading your message" count moves early; a prompt that fits one chunk is not cut,
    and the greedy text is that of unchunked reading."""
    from minisgl_engine.engine import FIRST_PREFILL_CHUNK_CPU

    llm = make_llm(tiny_dir, max_prefill_tokens=256)
    sched = llm.scheduler
    starts: list[int] = []
    sched.report_progress = lambda msgs: starts.extend(m.done for m in msgs if m.uid == 3)
    long, short = prompts_of([450, 250], seed=4)
    sched.add_request(3, long, GREEDY)
    sched.add_request(4, short, GREEDY)
    outputs = drain(llm, {})
    # as each chunk starts: 0 read, then the first chunk, then a full one; at the end all 450
    first = FIRST_PREFILL_CHUNK_CPU
    assert starts[:3] == [0, first, first + 256] and starts[-1] == 450
    whole = make_llm(tiny_dir, max_prefill_tokens=1024).generate([long, short], GREEDY)
    assert [outputs[3][0], outputs[4][0]] == [r.token_ids for r in whole]


def test_abort_while_waiting_frees_everything(tiny_dir) -> None:
    llm = make_llm(tiny_dir, max_running_requests=1)
    sched = llm.scheduler
    a, b = prompts_of([6, 6])
    sched.add_request(10, a, GREEDY)
    sched.add_request(11, b, GREEDY)
    (first,) = sched.step()  # 10 prefilled; 11 cannot start (one running request at most)
    assert first.uid == 10 and not first.finished
    assert sched.stats().waiting == 1 and 11 in sched.reqs
    sched.abort_request(11)
    assert 11 not in sched.reqs and sched.stats().waiting == 0
    outputs = drain(llm, {10: ([first.token_id], None)})
    assert 11 not in outputs
    assert outputs[10][1] == "length" and len(outputs[10][0]) == 10
    assert_all_pages_free(llm)
    assert sched.stats().requests_aborted_total == 1


def test_abort_mid_chunked_prefill_frees_pages(tiny_dir) -> None:
    for page_size in (1, 4):
        llm = make_llm(tiny_dir, page_size=page_size, max_prefill_tokens=16)
        sched = llm.scheduler
        (prompt,) = prompts_of([50])
        sched.add_request(5, prompt, GREEDY)
        assert sched.step() == []  # first chunk: no token yet
        assert assert_books_balance(llm).used > 0  # the prompt's pages are held
        sched.abort_request(5)
        assert 5 not in sched.reqs
        assert_all_pages_free(llm)
        assert sched.step() == []
        # the engine still works afterwards, and page-table rows were given back
        (again,) = prompts_of([50], seed=9)
        res = llm.generate([again], GREEDY)[0]
        assert len(res.token_ids) == 10
        assert_all_pages_free(llm)


def test_abort_mid_decode_frees_pages_and_leaves_the_others_intact(tiny_dir, reference) -> None:
    prompts, params, expected = reference
    llm = make_llm(tiny_dir, page_size=4)
    sched = llm.scheduler
    for uid, prompt in enumerate(prompts):
        sched.add_request(uid, prompt, params)
    outputs: dict = {}
    while not outputs or min(len(t) for t, _ in outputs.values()) < 5:
        for out in sched.step():
            toks, _ = outputs.setdefault(out.uid, ([], None))
            toks.append(out.token_id)
    assert sched.stats().running == len(prompts)
    used_before = assert_books_balance(llm).used
    sched.abort_request(2)
    assert 2 not in sched.reqs
    assert assert_books_balance(llm).used < used_before
    drain(llm, outputs)
    for uid in range(len(prompts)):
        if uid != 2:
            assert outputs[uid] == (expected[uid], "length")
    assert outputs[2][1] is None and outputs[2][0] == expected[2][: len(outputs[2][0])]
    assert_all_pages_free(llm)


def test_abort_that_overtakes_its_request_drops_the_request(tiny_dir) -> None:
    llm = make_llm(tiny_dir)
    sched = llm.scheduler
    a, b = prompts_of([5, 5])
    assert sched.abort_request(77) is None  # unknown yet: remembered
    sched.add_request(77, a, GREEDY)
    sched.add_request(78, b, GREEDY)
    assert 77 not in sched.reqs
    outputs = drain(llm)
    assert set(outputs) == {78}
    assert_all_pages_free(llm)


@pytest.mark.parametrize("cache", ["radix", "naive"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_small_pool_preempts_and_still_matches_the_reference(
    tiny_dir, reference, page_size, cache
) -> None:
    prompts, params, expected = reference
    need = max(len(p) for p in prompts) + params.max_tokens  # one request alone
    llm = make_llm(tiny_dir, page_size=page_size, max_kv_tokens=need + 4, cache=cache)
    sched = llm.scheduler
    for uid, prompt in enumerate(prompts):
        sched.add_request(uid, prompt, params)
    outputs: dict = {}
    preempted = 0
    waiting = sched.stats().waiting
    while sched.reqs:
        for out in sched.step():
            toks, _ = outputs.setdefault(out.uid, ([], None))
            toks.append(out.token_id)
            outputs[out.uid] = (toks, out.finish_reason.value if out.finished else None)
        stats = sched.stats()
        assert_books_balance(llm)
        preempted += stats.waiting > waiting  # nothing new arrives: a longer queue is a preemption
        waiting = stats.waiting
    assert preempted > 0, "the pool was meant to be too small for every request at once"
    assert [outputs[uid] for uid in range(len(prompts))] == [(e, "length") for e in expected]
    assert_all_pages_free(llm)


def test_small_pool_generate_finishes_everything(tiny_dir, reference) -> None:
    prompts, params, expected = reference
    llm = make_llm(tiny_dir, max_kv_tokens=36, page_size=4, max_running_requests=6)
    results = llm.generate(prompts, params)
    assert [r.token_ids for r in results] == expected
    assert_all_pages_free(llm)


def test_prompt_longer_than_the_context_is_refused_clearly(tiny_dir) -> None:
    llm = make_llm(tiny_dir, max_kv_tokens=2048)
    (long_prompt,) = prompts_of([CONTEXT + 88])
    with pytest.raises(RequestError) as info:
        llm.generate([long_prompt], GREEDY)
    msg = str(info.value)
    assert str(CONTEXT + 88) in msg and str(CONTEXT) in msg and "context" in msg
    assert "\n" not in msg
    with pytest.raises(RequestError):
        llm.scheduler.add_request(1, prompts_of([CONTEXT])[0], GREEDY)  # no room for one token
    assert not llm.scheduler.reqs
    assert_all_pages_free(llm)


def test_prompt_larger_than_the_kv_pool_is_refused_clearly(tiny_dir) -> None:
    llm = make_llm(tiny_dir, max_kv_tokens=64)
    with pytest.raises(RequestError, match="max-kv-tokens"):
        llm.scheduler.add_request(1, prompts_of([100])[0], GREEDY)
    assert not llm.scheduler.reqs


@pytest.mark.parametrize("bad", [[], [VOCAB], [-1, 5]], ids=["empty", "id=vocab", "negative"])
def test_bad_prompt_ids_are_refused(tiny_dir, bad) -> None:
    llm = make_llm(tiny_dir)
    with pytest.raises(RequestError):
        llm.scheduler.add_request(1, bad, GREEDY)
    assert not llm.scheduler.reqs


def test_a_refused_prompt_leaves_nothing_behind(tiny_dir) -> None:
    llm = make_llm(tiny_dir, max_kv_tokens=2048)
    ok, too_long = prompts_of([6, CONTEXT + 10])
    with pytest.raises(RequestError):
        llm.generate([ok, too_long], GREEDY)
    assert not llm.scheduler.reqs
    assert len(llm.generate([ok], GREEDY)[0].token_ids) == 10


def test_max_tokens_beyond_the_context_is_clamped(tiny_dir) -> None:
    llm = make_llm(tiny_dir, max_kv_tokens=2048, page_size=16, max_prefill_tokens=200)
    a, b = prompts_of([CONTEXT - 12, CONTEXT - 1])
    ra, rb = llm.generate([a, b], SamplingParams(max_tokens=100, ignore_eos=True))
    assert (len(ra.token_ids), ra.finish_reason) == (12, "length")
    assert (len(rb.token_ids), rb.finish_reason) == (1, "length")
    assert_all_pages_free(llm)


def test_stop_token_ids_end_with_stop(tiny_dir, reference) -> None:
    prompts, params, expected = reference
    full = expected[0]
    stop = full[4]
    cut = full.index(stop)  # its first appearance
    llm = make_llm(tiny_dir, page_size=4)
    res = llm.generate(
        [prompts[0], prompts[1]],
        [SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[stop]), params],
    )
    assert res[0].finish_reason == "stop"
    assert (
        res[0].token_ids == full[: cut + 1]
    )  # the stop token is the last id (as in vLLM); the text leaves it out
    assert (res[1].token_ids, res[1].finish_reason) == (expected[1], "length")
    assert_all_pages_free(llm)


@pytest.fixture(scope="module")
def eos_dir(tiny_dir, reference, tmp_path_factory):
    """The same weights, with EOS set to a token the greedy reference reply produces."""
    _, _, expected = reference
    folder = tmp_path_factory.mktemp("tiny-eos")
    shutil.copy(tiny_dir / "model.safetensors", folder / "model.safetensors")
    config = json.loads((tiny_dir / "config.json").read_text())
    config["eos_token_id"] = expected[0][6]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_eos_ends_with_stop_unless_ignore_eos(eos_dir, reference) -> None:
    prompts, _, expected = reference
    full = expected[0]
    cut = full.index(full[6])
    llm = make_llm(eos_dir)
    stopped, ignored = llm.generate(
        [prompts[0]] * 2,
        [SamplingParams(max_tokens=24), SamplingParams(max_tokens=24, ignore_eos=True)],
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full[: cut + 1]  # EOS is the last id, as a stop token is
    assert (ignored.token_ids, ignored.finish_reason) == (full, "length")
    assert_all_pages_free(llm)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_a_steps_host_tensor_holds_the_same_values_as_torch_tensor(dtype) -> None:
    """The one copy of a step builds its tensor through ``array`` (faster than torch.tensor on a
    long list): same values and dtype, negative placeholders, an empty list, and a float list for
    an integer dtype (torch.tensor's own conversion) included."""
    from minisgl_engine.transfer import ARRAY_FROM, host_tensor, to_device

    values = [0, -1, 5, 2**31 - 1, -(2**31), 7] if dtype != torch.bfloat16 else [0.5, -1.25, 3.0]
    for vals in (
        values * ARRAY_FROM,
        values,
        [],
        ([1.5, -2.5] if dtype.is_floating_point else [3, -4]) * ARRAY_FROM,
    ):
        want = torch.tensor(vals, dtype=dtype)
        got = host_tensor(vals, dtype)
        assert got.dtype == want.dtype and torch.equal(got, want), (vals, got, want)
        assert torch.equal(to_device(vals, torch.device("cpu"), dtype), want)
    floats = [2.7, -1.2] * ARRAY_FROM
    assert torch.equal(host_tensor(floats, torch.int64), torch.tensor(floats, dtype=torch.int64))
    big = list(range(-5, 50_000))
    assert torch.equal(host_tensor(big), torch.tensor(big))
