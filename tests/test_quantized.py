"""Quantized weights on CPU: each GGUF type read exactly, the packed products, the C decode steps,
and the demo model served from its GGUF against the float32 reference of the same weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from minisgl_engine.layers.quantized import (
    PackedWeight,
    QuantizedRows,
    gguf_planes,
    int4_planes,
    int8_planes,
    packed_kernels_available,
    planes_of,
    stack_rows,
)

pytestmark = pytest.mark.skipif(not packed_kernels_available(), reason="this torch build has no packed 4-bit CPU kernel")

# gguf's Python package quantizes these itself; the K-quants it only decodes
QUANTIZED_BY_GGUF = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTS = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K]


def _random_k_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks: random bytes, with every float16 field a small positive scale."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // per_block, block_bytes), dtype=np.uint8)
    f16 = lambda n: rng.uniform(0.001, 0.02, size=(rows, cols // per_block, n)).astype(np.float16).view(np.uint8)  # noqa: E731
    if qtype in (T.Q4_K, T.Q5_K):
        raw[..., 0:4] = f16(2)  # d, dmin
    elif qtype in (T.Q6_K, T.Q3_K):
        raw[..., -2:] = f16(1)  # d
    elif qtype == T.Q2_K:
        raw[..., -4:] = f16(2)  # d, dmin
    return raw.reshape(rows, -1)


def _blocks(qtype: T, rows: int = 48, cols: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw blocks, gguf's own float32 decoding of them)."""
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZED_BY_GGUF:
        raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    else:
        raw = _random_k_blocks(qtype, rows, cols, rng)
    return torch.from_numpy(raw), torch.from_numpy(dequantize(raw, qtype)).reshape(rows, cols)


@pytest.mark.parametrize("qtype", QUANTIZED_BY_GGUF + [T.Q4_K, T.Q5_K], ids=lambda q: q.name)
def test_planes_decode_each_type_exactly_as_gguf_does(qtype: T) -> None:
    raw, reference = _blocks(qtype)
    planes = gguf_planes(raw, int(qtype), reference.shape[1])
    assert planes is not None and planes.num_planes == (1 if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else 2)
    assert int(planes.codes.max()) <= 15
    torch.testing.assert_close(planes.dequantize(), reference, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q3_K, T.Q2_K], ids=lambda q: q.name)
def test_types_with_16_weight_scales_are_requantized_to_8_bits(qtype: T) -> None:
    raw, reference = _blocks(qtype)
    assert gguf_planes(raw, int(qtype), reference.shape[1]) is None
    planes = planes_of(raw, int(qtype), tuple(reference.shape))
    # at most half an 8-bit step of each group of 32
    step = reference.reshape(reference.shape[0], -1, 32).abs().amax(-1) / 127
    error = (planes.dequantize() - reference).abs().reshape(reference.shape[0], -1, 32).amax(-1)
    assert bool((error <= step / 2 * (1 + 1e-4) + 1e-7).all())


@pytest.mark.parametrize("qtype", QUANTIZED_BY_GGUF + K_QUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_product_matches_the_float32_product_of_the_same_weights(qtype: T, rows: int) -> None:
    raw, reference = _blocks(qtype, rows=40)  # 40 outputs: padded to 48 inside, cut on the way out
    packed = PackedWeight(planes_of(raw, int(qtype), tuple(reference.shape)))
    x = torch.randn(rows, reference.shape[1], generator=torch.Generator().manual_seed(1))
    expected = x @ planes_of(raw, int(qtype), tuple(reference.shape)).dequantize().t()
    got = packed.matmul(x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    # bf16 inputs, scales and outputs: a few parts in a thousand
    assert ((got - expected).norm() / expected.norm()).item() < 1e-2


def test_merged_parts_of_different_types_stack_by_rows() -> None:
    """A Q4_K_M file mixes types inside one merged matrix (q and k in Q4_K, v in Q6_K)."""
    parts = [_blocks(T.Q4_K, rows=32, seed=2), _blocks(T.Q8_0, rows=16, seed=3), _blocks(T.Q6_K, rows=16, seed=4)]
    planes = stack_rows([planes_of(raw, int(q), tuple(ref.shape)) for (raw, ref), q in zip(parts, (T.Q4_K, T.Q8_0, T.Q6_K))])
    assert planes.num_planes == 2 and planes.codes.shape[1] == 64
    exact = torch.cat([parts[0][1], parts[1][1]])
    torch.testing.assert_close(planes.dequantize()[:48], exact, rtol=0, atol=0)


def test_int4_and_int8_quantization_of_float_weights() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))
    for planes, bound in ((int4_planes(w), 0.5 / 15), (int8_planes(w), 0.5 / 127)):
        groups = w.reshape(64, -1, 32)
        span = groups.amax(-1) - groups.amin(-1) if planes.num_planes == 1 else groups.abs().amax(-1)
        error = (planes.dequantize() - w).abs().reshape(64, -1, 32).amax(-1)
        assert bool((error <= span * bound + 1e-6).all())


def test_quantized_embedding_rows_decode_exactly() -> None:
    for qtype in (T.Q8_0, T.Q4_K, T.Q6_K):
        raw, reference = _blocks(qtype, rows=20)
        table = QuantizedRows(raw, int(qtype), reference.shape[1])
        ids = torch.tensor([[3, 0], [19, 3]])
        torch.testing.assert_close(table.lookup(ids, torch.float32), reference[ids], rtol=0, atol=0)


# ---- the C decode steps (cpu_decode.c) against the same steps as torch ops ----


@pytest.fixture(scope="module")
def native():
    from minisgl_engine.layers.cpu_native import native_decode

    lib = native_decode()
    if lib is None:
        pytest.skip("no C compiler here: the C decode steps are not built")
    return lib


def test_native_add_rmsnorm(native) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 576, generator=gen).bfloat16()
    residual, w = torch.randn(1, 576, generator=gen), torch.rand(576, generator=gen) + 0.5
    residual_out, out = torch.empty(1, 576), torch.empty(1, 576, dtype=torch.bfloat16)
    native.add_rmsnorm(x.data_ptr(), 1, residual.data_ptr(), w.data_ptr(), 1e-5, 576, residual_out.data_ptr(), out.data_ptr(), 1)
    summed = x.float() + residual
    torch.testing.assert_close(residual_out, summed)
    torch.testing.assert_close(out, F.rms_norm(summed, (576,), w, 1e-5).bfloat16())
    out32 = torch.empty(1, 576)
    native.add_rmsnorm(residual.data_ptr(), 0, None, w.data_ptr(), 1e-5, 576, residual_out.data_ptr(), out32.data_ptr(), 0)
    torch.testing.assert_close(out32, F.rms_norm(residual, (576,), w, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scattered", [False, True])  # True: a cached prefix in other slots than the new tokens
@pytest.mark.parametrize("qk_norm", [False, True])
def test_native_rope_store_attend(native, qk_norm: bool, scattered: bool) -> None:
    from minisgl_engine.layers.rotary import RopeInputs, RotaryEmbedding, apply_rotary

    heads, kv_heads, dim, length = 9, 3, 64, 37
    gen = torch.Generator().manual_seed(1)
    rotary = RotaryEmbedding(dim, 4096, 100000.0, None, torch.float32)
    position = torch.tensor([length - 1])
    rope = RopeInputs(position, rotary.cos[position].unsqueeze(1), rotary.sin[position].unsqueeze(1))
    qkv = torch.randn(1, (heads + 2 * kv_heads) * dim, generator=gen).bfloat16()
    k_cache, v_cache = torch.randn(64, kv_heads, dim, generator=gen), torch.randn(64, kv_heads, dim, generator=gen)
    q_w, k_w = torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5
    slots = torch.randperm(64, generator=gen)[:length] if scattered else torch.arange(5, 5 + length)
    # the same steps as torch ops
    q, k, v = qkv.float().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=1)
    q, k, v = q.view(1, heads, dim), k.view(1, kv_heads, dim), v.view(1, kv_heads, dim)
    if qk_norm:
        q, k = F.rms_norm(q, (dim,), q_w, 1e-6), F.rms_norm(k, (dim,), k_w, 1e-6)
    q, k = apply_rotary(q, rope), apply_rotary(k, rope)
    ks, vs = k_cache.clone(), v_cache.clone()
    ks[slots[-1]], vs[slots[-1]] = k[0], v[0]
    expected = F.scaled_dot_product_attention(
        q.unsqueeze(2), ks[slots].transpose(0, 1).unsqueeze(0), vs[slots].transpose(0, 1).unsqueeze(0),
        scale=dim**-0.5, enable_gqa=True).reshape(1, -1)
    out = torch.empty(1, heads * dim, dtype=torch.bfloat16)
    scratch = torch.empty(heads * dim + length)
    native.rope_store_attend(qkv.data_ptr(), heads, kv_heads, dim, q_w.data_ptr() if qk_norm else None,
                             k_w.data_ptr() if qk_norm else None, 1e-6, rope.cos.data_ptr(), rope.sin.data_ptr(),
                             k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), length, dim**-0.5, out.data_ptr(),
                             scratch.data_ptr())
    torch.testing.assert_close(k_cache, ks, rtol=1e-6, atol=1e-6)  # the new token's K and V written, nothing else
    torch.testing.assert_close(v_cache, vs, rtol=0, atol=0)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def test_native_silu_mul(native) -> None:
    gate_up = torch.randn(1, 2 * 1536, generator=torch.Generator().manual_seed(2)).bfloat16()
    out = torch.empty(1, 1536, dtype=torch.bfloat16)
    native.silu_mul(gate_up.data_ptr(), 1536, out.data_ptr())
    g, u = gate_up.float().chunk(2, dim=1)
    torch.testing.assert_close(out, (F.silu(g) * u).bfloat16())


# ---- the demo model from its GGUF (CI pulls it; skipped when absent) ----


@pytest.fixture(scope="module")
def demo_engines():
    from minisgl_engine.llm import LLM
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled (run `minisgl-chat pull`)")
    packed = LLM(device="cpu", max_kv_tokens=2048)
    reference = LLM(device="cpu", max_kv_tokens=2048, quantization="none")
    return packed, reference


TEXT = ("The city of Paris is the capital of France. It lies on the Seine river, in the north of the country. "
        "Paris is known for its museums, such as the Louvre, and for the Eiffel Tower, which was built in 1889 "
        "for a world's fair. Millions of people visit the city every year.")


def test_demo_model_weights_stay_quantized(demo_engines) -> None:
    packed, reference = demo_engines
    assert packed.engine.model.model.layers[0].mlp.down_proj.quant is not None
    assert packed.engine.model.model.embed_tokens.quant_rows is not None
    assert reference.engine.model.model.layers[0].mlp.down_proj.quant is None
    # the weights' bytes: the file's blocks plus their packed copies, not 540 MB of float32
    weights = sum(m.quant.nbytes for m in packed.engine.model.modules() if getattr(m, "quant", None) is not None)
    weights += packed.engine.model.tied_lm_head_packed.nbytes + packed.engine.model.model.embed_tokens.quant_rows.nbytes
    assert weights < 160_000_000, weights


def test_demo_model_from_its_gguf_agrees_with_the_float32_reference(demo_engines) -> None:
    """Teacher-forced over real text: the packed engine's next-token choice equals the float32
    reference's at most positions, and the distributions are close (docs/benchmarks.md has the
    figures over a longer text)."""
    packed, reference = demo_engines
    ids = packed.encode(TEXT)
    logits = []
    for llm in (packed, reference):
        model = llm.engine.model
        captured = []
        hook = model.register_forward_hook(lambda mod, inp, out: captured.append(out.detach().clone()))
        from minisgl_engine.sampling_params import SamplingParams

        llm.generate([ids[:n] for n in range(8, len(ids))], SamplingParams(max_tokens=1, temperature=0))
        hook.remove()
        logits.append(torch.cat(captured))
    ours, ref = logits
    assert ours.shape == ref.shape and ours.shape[0] == len(ids) - 8
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    kl = F.kl_div(ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean").item()
    assert agree >= 0.9, agree
    assert kl < 0.05, kl


def test_native_decode_equals_the_torch_ops_path(demo_engines, native) -> None:
    """The C steps and the same layer as torch ops round to bf16 at the same places but sum in
    different orders, so their logits differ at bf16's noise: the same greedy tokens until a
    near-tie, and close log-probabilities."""
    from minisgl_engine.sampling_params import SamplingParams

    packed, _ = demo_engines
    layers = packed.engine.model.model.layers
    assert packed.engine.native_decode and layers[0].native is not None
    ids = packed.encode("Write a short poem about the sea.", chat=True)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=2)
    [native] = packed.generate([ids], params)
    lib = layers[0].native
    for layer in layers:
        layer.native = None
    try:
        [torch_ops] = packed.generate([ids], params)
    finally:
        for layer in layers:
            layer.native = lib
    same = next((i for i, (a, b) in enumerate(zip(native.token_ids, torch_ops.token_ids)) if a != b), len(native.token_ids))
    assert same >= 8, (native.token_ids, torch_ops.token_ids)
    if same < len(native.token_ids):  # a near-tie: the two best candidates within bf16 noise
        top = native.logprobs[same].top
        assert top[0][1] - top[1][1] < 0.15, top
    diffs = [abs(a.logprob - b.logprob) for a, b in zip(native.logprobs[:same], torch_ops.logprobs[:same])]
    assert max(diffs) < 0.1 and math.fsum(diffs) / len(diffs) < 0.03, diffs


def test_packed_product_and_lookup_of_no_rows() -> None:
    """A prefill step in which no request samples asks the LM head for zero rows."""
    raw, reference = _blocks(T.Q8_0, rows=32)
    assert PackedWeight(planes_of(raw, int(T.Q8_0), tuple(reference.shape))).matmul(torch.empty(0, 512)).shape == (0, 32)
    assert QuantizedRows(raw, int(T.Q8_0), 512).lookup(torch.empty(0, 4, dtype=torch.long), torch.float32).shape == (0, 4, 512)


# ---- the GGUF reader against transformers' own GGUF loader; float checkpoints quantized at load ----


@pytest.mark.slow
def test_gguf_tensors_equal_transformers_reading_of_the_demo_file() -> None:
    """Names, the Llama q/k row order and every value: transformers' GGUF loader is the reference."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete
    from minisgl_engine.weights.gguf_tensors import GGUFTensor, iter_gguf

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled (run `minisgl-chat pull`)")
    from transformers import AutoConfig, AutoModelForCausalLM

    path = demo_model_dir() / "model.gguf"
    with torch.device("meta"):  # names only: transformers maps the file's names through a model
        names_from = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(demo_model_dir()))
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=names_from)["tensors"]
    ours = {name: t.dequantize() if isinstance(t, GGUFTensor) else t for name, t in iter_gguf(path)}
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: transformers names the head too
    for name, tensor in ours.items():
        assert torch.equal(tensor.float(), torch.as_tensor(theirs[name]).float()), name


@pytest.mark.parametrize("kind, tolerance", [("int8", 0.03), ("int4", 0.4)])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float_checkpoint_quantized_at_load(tiny_model, arch: str, kind: str, tolerance: float) -> None:
    """``--quantization int8 | int4``: every projection and the tied or untied LM head packed;
    logits near the float32 engine's on the same weights. Random weights are the hard case for
    4 bits (a Gaussian group of 32 has no structure to keep): ~8% error per product, ~30% on the
    logits of this 2-layer model; 8 bits stay within a few percent."""
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model(arch)
    quantized = LLM(str(folder), device="cpu", quantization=kind, max_kv_tokens=512)
    reference = LLM(str(folder), device="cpu", quantization="none", max_kv_tokens=512)
    assert quantized.engine.model.model.layers[0].self_attn.qkv_proj.quant is not None
    ids = list(range(3, 40))
    logits = []
    for llm in (quantized, reference):
        captured = []
        hook = llm.engine.model.register_forward_hook(lambda mod, inp, out: captured.append(out.detach().clone()))
        from minisgl_engine.sampling_params import SamplingParams

        llm.generate([ids[:n] for n in range(20, len(ids))], SamplingParams(max_tokens=1, temperature=0))
        hook.remove()
        logits.append(torch.cat(captured))
    ours, ref = logits
    assert ours.shape == ref.shape
    assert ((ours - ref).norm() / ref.norm()).item() < tolerance


def test_quantization_flags_that_cannot_apply_say_so(tiny_model) -> None:
    from minisgl_engine.errors import UserError
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model("llama")
    with pytest.raises(UserError, match="quantization"):
        LLM(str(folder), device="cpu", quantization="int3")
