"""``--kv-dtype fp8``: the KV pool in FP8 (e4m3), on the CPU path (float32 model).

The reference is transformers on the same weights with each layer's K and V (after RoPE, as
the pool holds them) rounded to FP8 and widened back before attention: the only difference
FP8 storage may make. Our logits must match that within float32 noise, and differ from the
full-precision pool's (else the option would store nothing in FP8)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import TINY

from minisgl_engine.errors import UserError
from minisgl_engine.llm import LLM

FP8 = torch.float8_e4m3fn


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, TINY["vocab_size"]) for _ in range(n)]


FP8_KV_ATTENTION = "fp8_kv_sdpa"


def register_fp8_kv_attention() -> None:
    """transformers' SDPA attention with K and V rounded to FP8 first, as ``FP8_KV_ATTENTION``
    (for ``model.set_attn_implementation``; test_cuda.py uses it too)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def fp8_kv_sdpa(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(
            module, query, key.to(FP8).to(key.dtype), value.to(FP8).to(value.dtype), *args, **kwargs
        )

    AttentionInterface.register(FP8_KV_ATTENTION, fp8_kv_sdpa)


@pytest.fixture(scope="module")
def hf_fp8_kv():
    register_fp8_kv_attention()
    return FP8_KV_ATTENTION


@pytest.mark.parametrize("arch", ["qwen3", "llama3"])
def test_fp8_pool_matches_transformers_with_fp8_rounded_kv(tiny_model, hf_fp8_kv, arch):
    folder, hf = tiny_model(arch)
    ids = random_ids(90, seed=7)
    # chunked prefill (budget 32) reads earlier chunks from the pool; the last 30 tokens decode one at a time
    fp8 = LLM(
        str(folder),
        device="cpu",
        max_kv_tokens=4096,
        max_prefill_tokens=32,
        max_running_requests=4,
        kv_dtype="fp8",
    )
    assert fp8.engine.kv_pool.k_cache.dtype == fp8.engine.kv_pool.v_cache.dtype == FP8
    ours = fp8.score(ids, prefill_len=60)
    plain = LLM(
        str(folder), device="cpu", max_kv_tokens=4096, max_prefill_tokens=32, max_running_requests=4
    ).score(ids, prefill_len=60)

    implementation = hf.config._attn_implementation
    hf.set_attn_implementation(hf_fp8_kv)
    try:
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
    finally:
        hf.set_attn_implementation(implementation)
    tol = 1e-4 * ref.abs().max().item() + 1e-5
    err = (ours - ref).abs().max().item()
    # a value on an FP8 rounding boundary may round the other way under float32 noise: allow a
    # few such positions, none far off
    off = ((ours - ref).abs() > tol).any(-1).float().mean().item()
    assert off <= 0.05 and err <= 50 * tol, (
        f"max |logit difference| {err:.3g} (tolerance {tol:.3g}), {100 * off:.0f}% of positions off"
    )
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95
    assert (ours - plain).abs().max().item() > 10 * tol, (
        "the FP8 pool gave the full-precision pool's logits"
    )


def test_fp8_pool_holds_twice_the_tokens_in_the_same_memory(tiny_model):
    """Sized from memory, the pool gets a quarter of the float32 pool's bytes per token."""
    from minisgl_engine.kvcache import KVPool

    folder, _ = tiny_model("qwen3")
    fp8 = LLM(str(folder), device="cpu", max_kv_tokens=1000, kv_dtype="fp8")
    pool = fp8.engine.kv_pool
    assert pool.k_cache.element_size() == 1 and pool.num_slots == 1000
    per_token = KVPool.bytes_per_token(TINY["num_hidden_layers"], 1, 32, FP8)
    assert per_token * 4 == KVPool.bytes_per_token(TINY["num_hidden_layers"], 1, 32, torch.float32)
    out = fp8.generate([random_ids(20, seed=1)], None)[0]
    assert out.token_ids and fp8.scheduler.stats().kv_pages_used == 0


def test_an_unknown_kv_dtype_is_a_clear_error(tiny_model):
    folder, _ = tiny_model("qwen3")
    with pytest.raises(
        UserError, match="--kv-dtype 'int4': choose auto, fp8, float16, bfloat16, float32"
    ):
        LLM(str(folder), device="cpu", max_kv_tokens=256, kv_dtype="int4")


def test_kv_dtype_choices_by_device():
    """``auto``: float16 for a float32 model on CPU, the model's dtype elsewhere; a GPU takes
    its model's dtype or FP8, any 16- or 32-bit type only on CPU."""
    from minisgl_engine.kvcache.kv_pool import resolve_kv_dtype

    assert resolve_kv_dtype("auto", torch.float32, "cpu") == torch.float16
    assert resolve_kv_dtype("auto", torch.bfloat16, "cpu") == torch.bfloat16
    assert resolve_kv_dtype("auto", torch.bfloat16, "cuda") == torch.bfloat16
    assert resolve_kv_dtype("fp8", torch.bfloat16, "cuda") == FP8
    assert resolve_kv_dtype("bfloat16", torch.float32, "cpu") == torch.bfloat16
    assert resolve_kv_dtype("float32", torch.float32, "cpu") == torch.float32
    assert resolve_kv_dtype("bfloat16", torch.bfloat16, "cuda") == torch.bfloat16
    with pytest.raises(UserError, match="--kv-dtype float16 on a GPU: choose auto"):
        resolve_kv_dtype("float16", torch.bfloat16, "cuda")
