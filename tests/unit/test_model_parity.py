"""Our model implementations against Hugging Face transformers on the same random weights
(float32, CPU): logits within 1e-4 * max|logit| + 1e-5, greedy tokens identical. Each with a
float32 KV cache and with the CPU's default float16 one; against the latter, transformers attends
to K and V rounded to float16 (after RoPE, as the pool holds them): the only difference the
16-bit cache may make."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import ARCHS, TINY

from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    tol = 1e-4 * ref.abs().max().item() + 1e-5
    err = (ours - ref).abs().max().item()
    assert err <= tol, f"max |logit difference| {err:.3g} > tolerance {tol:.3g}"


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, TINY["vocab_size"]) for _ in range(n)]


F16_KV_ATTENTION = "f16_kv_sdpa"


def register_f16_kv_attention() -> None:
    """transformers' SDPA attention with K and V rounded to float16 first."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def f16_kv_sdpa(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(
            module, query, key.half().to(key.dtype), value.half().to(value.dtype), *args, **kwargs
        )

    AttentionInterface.register(F16_KV_ATTENTION, f16_kv_sdpa)


@pytest.fixture(
    scope="module",
    params=[(arch, kv) for arch in ARCHS for kv in ("float32", "float16")],
    ids=lambda p: "-".join(p),
)
def arch_pair(request, tiny_model):
    arch, kv_dtype = request.param
    folder, hf = tiny_model(arch)
    # a small prefill budget so that long prompts are chunked
    llm = LLM(
        str(folder),
        device="cpu",
        max_kv_tokens=8192,
        max_prefill_tokens=48,
        max_running_requests=8,
        kv_dtype=kv_dtype,
    )
    assert llm.engine.kv_pool.dtype == getattr(torch, kv_dtype)
    implementation = hf.config._attn_implementation
    if kv_dtype == "float16":
        register_f16_kv_attention()
        hf.set_attn_implementation(F16_KV_ATTENTION)
    yield llm, hf
    hf.set_attn_implementation(implementation)


@pytest.mark.parametrize("prefill_len", [100, 30, 1])
def test_logits_match_transformers(arch_pair, prefill_len):
    """prefill_len 100 > budget 48: chunked prefill over cached pages; the tokens after
    prefill_len go through one decode step each."""
    llm, hf = arch_pair
    ids = random_ids(100, seed=prefill_len)
    before = llm.scheduler.stats()
    ours = llm.score(ids, prefill_len=prefill_len)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert ours.shape == ref.shape
    assert_logits_close(ours, ref)
    # scoring ends its request as a finish, not an abort, and gives every page back
    after = llm.scheduler.stats()
    assert (
        after.requests_finished_total - before.requests_finished_total,
        after.requests_aborted_total - before.requests_aborted_total,
    ) == (1, 0)
    assert after.kv_pages_used == 0 and not llm.scheduler.has_work


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()


def test_greedy_batch_matches_transformers(arch_pair):
    """A batch of different lengths, one longer than the prefill budget (chunked)."""
    llm, hf = arch_pair
    prompts = [random_ids(n, seed=n) for n in (5, 17, 33, 120)]
    results = llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
    for prompt, res in zip(prompts, results):
        assert res.token_ids == hf_greedy(hf, prompt, 32)
        assert res.finish_reason == "length"
    assert llm.scheduler.stats().kv_pages_used == 0


def test_requests_joining_a_running_batch(arch_pair):
    """Requests added while others are mid-decode get the same tokens as alone."""
    llm, hf = arch_pair
    sched = llm.scheduler
    prompts = {100 + i: random_ids(n, seed=100 + n) for i, n in enumerate((9, 60, 21))}
    got: dict[int, list[int]] = {uid: [] for uid in prompts}
    pending = set(prompts)
    uids = list(prompts)
    sched.add_request(uids[0], prompts[uids[0]], SamplingParams(max_tokens=32, ignore_eos=True))
    step = 0
    while pending:
        if step == 5:
            sched.add_request(
                uids[1], prompts[uids[1]], SamplingParams(max_tokens=32, ignore_eos=True)
            )
        if step == 11:
            sched.add_request(
                uids[2], prompts[uids[2]], SamplingParams(max_tokens=32, ignore_eos=True)
            )
        for out in sched.step():
            got[out.uid].append(out.token_id)
            if out.finished:
                pending.discard(out.uid)
        step += 1
    for uid, prompt in prompts.items():
        assert got[uid] == hf_greedy(hf, prompt, 32), f"request {uid}"
    assert sched.stats().kv_pages_used == 0 and sched.stats().running == 0
