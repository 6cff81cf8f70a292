"""Quantized weights on CPU: each GGUF type read exactly, torch's packed products and our C
kernels' products on each instruction path, the C decode step against the same layers as torch
ops, and the demo model served from its GGUF against the float32 reference of the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from minisgl_engine.layers.quantized import (
    INTEGER_DOT_MAX_ROWS,
    NativeRows,
    NativeWeight,
    PackedWeight,
    QuantizedRows,
    gguf_planes,
    int4_planes,
    int8_planes,
    pack_weight,
    packed_kernels_available,
    planes_of,
    stack_rows,
)

pytestmark = pytest.mark.skipif(
    not packed_kernels_available(), reason="this torch build has no packed 4-bit CPU kernel"
)

# gguf's Python package quantizes these itself; the K-quants it only decodes
QUANTIZED_BY_GGUF = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTS = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K]


def _random_k_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks: random bytes, with every float16 field a small positive scale."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // per_block, block_bytes), dtype=np.uint8)
    f16 = lambda n: (  # noqa: E731
        rng.uniform(0.001, 0.02, size=(rows, cols // per_block, n))
        .astype(np.float16)
        .view(np.uint8)
    )
    if qtype in (T.Q4_K, T.Q5_K):
        raw[..., 0:4] = f16(2)  # d, dmin
    elif qtype in (T.Q6_K, T.Q3_K):
        raw[..., -2:] = f16(1)  # d
    elif qtype == T.Q2_K:
        raw[..., -4:] = f16(2)  # d, dmin
    return raw.reshape(rows, -1)


def _blocks(
    qtype: T, rows: int = 48, cols: int = 512, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
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
    assert planes is not None and planes.num_planes == (
        1 if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else 2
    )
    assert int(planes.codes.max()) <= 15
    torch.testing.assert_close(planes.dequantize(), reference, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [T.Q6_K, T.Q3_K, T.Q2_K], ids=lambda q: q.name)
def test_types_with_16_weight_scales_are_requantized_to_8_bits(qtype: T) -> None:
    raw, reference = _blocks(qtype)
    assert gguf_planes(raw, int(qtype), reference.shape[1]) is None
    planes = planes_of(raw, int(qtype), tuple(reference.shape))
    # at most half an 8-bit step of each group of 32 (the step rounded up to a float16 value)
    step = reference.reshape(reference.shape[0], -1, 32).abs().amax(-1) / 127
    error = (planes.dequantize() - reference).abs().reshape(reference.shape[0], -1, 32).amax(-1)
    assert bool((error <= step / 2 * (1 + 2**-10) + 1e-7).all())


@pytest.mark.parametrize("qtype", QUANTIZED_BY_GGUF + K_QUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_product_matches_the_float32_product_of_the_same_weights(
    qtype: T, rows: int
) -> None:
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
    parts = [
        _blocks(T.Q4_K, rows=32, seed=2),
        _blocks(T.Q8_0, rows=16, seed=3),
        _blocks(T.Q6_K, rows=16, seed=4),
    ]
    planes = stack_rows(
        [
            planes_of(raw, int(q), tuple(ref.shape))
            for (raw, ref), q in zip(parts, (T.Q4_K, T.Q8_0, T.Q6_K))
        ]
    )
    assert planes.num_planes == 2 and planes.codes.shape[1] == 64
    exact = torch.cat([parts[0][1], parts[1][1]])
    torch.testing.assert_close(planes.dequantize()[:48], exact, rtol=0, atol=0)


def test_int4_and_int8_quantization_of_float_weights() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))
    for planes, bound in ((int4_planes(w), 0.5 / 15), (int8_planes(w), 0.5 / 127)):
        groups = w.reshape(64, -1, 32)
        span = (
            groups.amax(-1) - groups.amin(-1) if planes.num_planes == 1 else groups.abs().amax(-1)
        )
        error = (planes.dequantize() - w).abs().reshape(64, -1, 32).amax(-1)
        assert bool(
            (error <= span * bound * (1 + 2**-9) + 1e-6).all()
        )  # float16 scales, rounded outwards
        assert torch.equal(planes.scales.half().float(), planes.scales) and torch.equal(
            planes.offset.half().float(), planes.offset
        )


def test_quantized_embedding_rows_decode_exactly() -> None:
    for qtype in (T.Q8_0, T.Q4_K, T.Q6_K):
        raw, reference = _blocks(qtype, rows=20)
        table = QuantizedRows(raw, int(qtype), reference.shape[1])
        ids = torch.tensor([[3, 0], [19, 3]])
        torch.testing.assert_close(table.lookup(ids, torch.float32), reference[ids], rtol=0, atol=0)


# ---- our C kernels (cpu_kernels.c): each product path against the float32 product ----

# the build's own path (AVX-512 VNNI here), AVX2 without VNNI, plain C: each a separate build
PATH_FLAGS = {
    "native": (),
    "avx2": ("-DMINISGL_NO_VNNI",),
    "plain-c": ("-DMINISGL_NO_VNNI", "-DMINISGL_NO_AVX2"),
}


@pytest.fixture(scope="module", params=list(PATH_FLAGS))
def kernels(request):
    from minisgl_engine.kernels.cpu_native import load_library

    try:
        return load_library(PATH_FLAGS[request.param])
    except OSError as exc:
        pytest.skip(f"the C kernels do not build here: {exc}")


@pytest.mark.parametrize(
    "qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda q: q.name
)
@pytest.mark.parametrize("rows", [1, 5, 200])
def test_native_product_matches_the_float32_product_of_the_same_weights(
    kernels, qtype: T, rows: int
) -> None:
    """Up to INTEGER_DOT_MAX_ROWS rows: 16-bit activations against the codes (a few parts in
    100,000); above: the weight widened to float32 and the BLAS (float32's error, plus the
    float16 rounding of a K-quant's scale times its sub-block scale, <= 2^-11)."""
    assert 5 <= INTEGER_DOT_MAX_ROWS < 200  # both ways are tested
    raw, reference = _blocks(qtype, rows=40, cols=512)
    planes = planes_of(raw, int(qtype), tuple(reference.shape))
    weight = NativeWeight(planes, kernels)
    assert weight.kind == (4 if planes.num_planes == 1 else 8)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1))
    expected = x @ planes.dequantize().t()
    got = weight.matmul(x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    error = ((got - expected).norm() / expected.norm()).item()
    assert error < (1e-4 if qtype not in (T.Q4_K,) else 1e-3), error


def test_every_product_path_computes_the_same_sums() -> None:
    """The integer sums are exact on every path: the paths differ only in float rounding."""
    from minisgl_engine.kernels.cpu_native import load_library

    try:
        libs = {name: load_library(flags) for name, flags in PATH_FLAGS.items()}
    except OSError as exc:
        pytest.skip(f"the C kernels do not build here: {exc}")
    assert libs["plain-c"].kernel_path() == 0
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2))
    for qtype in (T.Q4_1, T.Q8_0):
        raw, reference = _blocks(qtype, rows=24, cols=512)
        planes = planes_of(raw, int(qtype), tuple(reference.shape))
        outs = {name: NativeWeight(planes, lib).matmul(x) for name, lib in libs.items()}
        for name, out in outs.items():
            torch.testing.assert_close(out, outs["plain-c"], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda q: q.name)
def test_native_layout_holds_the_gguf_weights_exactly(kernels, qtype: T) -> None:
    """Types whose scales are float16 in the file keep every weight bit for bit."""
    raw, reference = _blocks(qtype, rows=16, cols=256)
    weight = NativeWeight(planes_of(raw, int(qtype), tuple(reference.shape)), kernels)
    widened = torch.empty(16, 256)
    kernels.qdequantize(weight.struct, 0, 16, widened.data_ptr())
    torch.testing.assert_close(widened, reference, rtol=0, atol=0)


def test_tied_embedding_rows_read_from_the_lm_heads_codes(kernels) -> None:
    for qtype in (T.Q8_0, T.Q4_1):
        raw, reference = _blocks(qtype, rows=40, cols=256)
        rows = NativeRows(NativeWeight(planes_of(raw, int(qtype), tuple(reference.shape)), kernels))
        ids = torch.tensor([[3, 0, 39], [39, 3, 7]])
        torch.testing.assert_close(rows.lookup(ids, torch.float32), reference[ids], rtol=0, atol=0)
        many = torch.arange(40).flip(0)  # enough rows for the threads to share them
        torch.testing.assert_close(
            rows.lookup(many, torch.float32), reference[many], rtol=0, atol=0
        )
        with pytest.raises(IndexError):
            rows.lookup(torch.tensor([40]), torch.float32)


def test_native_layout_of_mixed_merged_parts(kernels) -> None:
    """A Q4_K_M merged matrix (Q4_K rows with Q6_K rows, two planes): one 8-bit layout."""
    parts = [_blocks(T.Q4_K, rows=32, seed=2), _blocks(T.Q6_K, rows=32, seed=4)]
    planes = stack_rows(
        [planes_of(raw, int(q), tuple(ref.shape)) for (raw, ref), q in zip(parts, (T.Q4_K, T.Q6_K))]
    )
    weight = NativeWeight(planes, kernels)
    widened = torch.empty(64, 512)
    kernels.qdequantize(weight.struct, 0, 64, widened.data_ptr())
    exact = planes.dequantize()
    # the K-quants' scale * sub-block scale rounded to float16: 2^-11 of the group's largest weight
    largest = (
        exact.abs().reshape(64, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(64, 512)
    )
    assert ((widened - exact).abs() <= largest * 2**-10).all()
    assert torch.equal(
        widened[32:], exact[32:]
    )  # the Q6_K rows, re-quantized to float16-exact scales


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


@pytest.fixture(scope="module")
def demo_float32_kv(demo_engines):
    """The packed demo engine with a float32 KV cache (demo_engines' have the default float16)."""
    from minisgl_engine.llm import LLM

    return LLM(device="cpu", max_kv_tokens=2048, kv_dtype="float32")


TEXT = (
    "The city of Paris is the capital of France. It lies on the Seine river, in the north of the country. "
    "Paris is known for its museums, such as the Louvre, and for the Eiffel Tower, which was built in 1889 "
    "for a world's fair. Millions of people visit the city every year."
)


def test_demo_model_weights_stay_quantized(demo_engines) -> None:
    packed, reference = demo_engines
    assert packed.engine.model.model.layers[0].mlp.down_proj.quant is not None
    assert packed.engine.model.model.embed_tokens.quant_rows is not None
    assert reference.engine.model.model.layers[0].mlp.down_proj.quant is None
    # the weights' bytes: the file's blocks plus their packed copies, not 540 MB of float32
    weights = sum(
        m.quant.nbytes
        for m in packed.engine.model.modules()
        if getattr(m, "quant", None) is not None
    )
    weights += (
        packed.engine.model.tied_lm_head_packed.nbytes
        + packed.engine.model.model.embed_tokens.quant_rows.nbytes
    )
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
        hook = model.register_forward_hook(
            lambda mod, inp, out: captured.append(out.detach().clone())
        )
        from minisgl_engine.sampling_params import SamplingParams

        llm.generate(
            [ids[:n] for n in range(8, len(ids))], SamplingParams(max_tokens=1, temperature=0)
        )
        hook.remove()
        logits.append(torch.cat(captured))
    ours, ref = logits
    assert ours.shape == ref.shape and ours.shape[0] == len(ids) - 8
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    kl = F.kl_div(
        ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean"
    ).item()
    assert agree >= 0.9, agree
    assert kl < 0.05, kl


def _native_against_torch_ops(llm, prompts: list[list[int]], max_tokens: int):
    """The same greedy requests with the C decode step and with the layers as torch ops (the
    products are the same C kernels in both; attention, norms and RoPE are not)."""
    from minisgl_engine.sampling_params import SamplingParams

    decoder = llm.engine.model.model
    assert llm.engine.native_decode and decoder.native_decoder is not None
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=2
    )
    llm.generate(
        prompts, SamplingParams(max_tokens=1)
    )  # both runs then find the prompt in the prefix cache
    native = llm.generate(prompts, params)
    saved, decoder.native_decoder = decoder.native_decoder, None
    try:
        torch_ops = llm.generate(prompts, params)
    finally:
        decoder.native_decoder = saved
    return list(zip(native, torch_ops))


def _assert_same_tokens_and_logprobs(native, torch_ops, min_same: int, tolerance: float) -> None:
    """Both paths run the same C products on 16-bit activations; attention, norms and RoPE sum in
    other orders, so the log-probabilities differ in float32's last places (a wrong rotation,
    slot or head would change them by more than 1). A near-tie may still part the tokens."""
    same = next(
        (i for i, (a, b) in enumerate(zip(native.token_ids, torch_ops.token_ids)) if a != b),
        len(native.token_ids),
    )
    if same < len(native.token_ids):
        top = native.logprobs[same].top
        assert same >= min_same and top[0][1] - top[1][1] < 0.01, (
            same,
            top,
            native.token_ids,
            torch_ops.token_ids,
        )
    diffs = [
        abs(a.logprob - b.logprob)
        for a, b in zip(native.logprobs[:same], torch_ops.logprobs[:same])
    ]
    assert max(diffs) < tolerance, diffs


# Tolerances of the log-probabilities per KV cache type: float32 noise alone, and with a 16-bit
# cache the K/V values that float32 noise moves across a rounding boundary (one float16 step is
# 2^-11 of the value, one bfloat16 step 2^-8); a wrong slot, head or widening is off by > 0.1.
KV_TOLERANCES = {"float32": 1e-3, "float16": 4e-3, "bfloat16": 3e-2}


def test_demo_model_with_a_float16_kv_cache_agrees_with_a_float32_one(
    demo_engines, demo_float32_kv
) -> None:
    """The CPU's default KV cache: teacher-forced over real text, each position computed alone
    over its prefix read back from the cache, the same next token at >= 99% of positions
    (measured: all 250 of scripts/cpu_agreement.py's text) and KL < 1e-4; greedy replies (the C
    decode step over the cache) identical for 48 tokens (measured: 64 of 64 on six chat prompts)."""
    from minisgl_engine.sampling_params import SamplingParams

    narrow, wide = demo_engines[0], demo_float32_kv
    assert narrow.engine.kv_pool.dtype == torch.float16 and narrow.engine.native_decode
    ids = narrow.encode(TEXT)
    logits = []
    for llm in (narrow, wide):
        captured = []
        hook = llm.engine.model.register_forward_hook(
            lambda mod, inp, out: captured.append(out.detach().clone())
        )
        llm.generate(
            [ids[:8]], SamplingParams(max_tokens=1)
        )  # each longer prompt then prefills one new token
        captured.clear()
        for n in range(9, len(ids)):
            llm.generate([ids[:n]], SamplingParams(max_tokens=1, temperature=0))
        hook.remove()
        logits.append(torch.cat(captured))
    ours, ref = logits
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    kl = F.kl_div(
        ours.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean"
    ).item()
    assert agree >= 0.99 and kl < 1e-4, (agree, kl)
    greedy = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    for prompt in ("What is the capital of France?", "Write a short poem about the sea."):
        chat = narrow.encode(prompt, chat=True)
        assert (
            narrow.generate([chat], greedy)[0].token_ids
            == wide.generate([chat], greedy)[0].token_ids
        ), prompt


@pytest.mark.parametrize("kv_dtype", ["float16", "float32"])
def test_native_decode_equals_the_torch_ops_path(
    demo_engines, demo_float32_kv, kv_dtype: str
) -> None:
    """The demo model over a prompt long enough for the threads to split attention (>= 64
    cached tokens); then a second turn whose prefix comes from the radix cache (its slots are not
    one run). float16 is the CPU's default KV cache."""
    packed = demo_engines[0] if kv_dtype == "float16" else demo_float32_kv
    assert packed.engine.kv_pool.dtype == getattr(torch, kv_dtype)
    tolerance = KV_TOLERANCES[kv_dtype]
    first = packed.encode(TEXT + " Tell me more about it.", chat=True)
    for native, torch_ops in _native_against_torch_ops(packed, [first], 24):
        _assert_same_tokens_and_logprobs(native, torch_ops, 6, tolerance)
    second = first + packed.encode(" And what about the Seine?")
    for native, torch_ops in _native_against_torch_ops(packed, [second], 16):
        _assert_same_tokens_and_logprobs(native, torch_ops, 6, tolerance)


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_native_decode_of_each_architecture(tiny_model, arch: str, kv_dtype: str) -> None:
    """QKV bias (Qwen2), q/k norms (Qwen3), a head size other than hidden / heads (Mistral):
    the C step against the torch layers on the same 8-bit weights, past 64 cached tokens."""
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model(arch)
    llm = LLM(str(folder), device="cpu", quantization="int8", max_kv_tokens=512, kv_dtype=kv_dtype)
    prompt = [(7 * i) % 300 + 3 for i in range(80)]
    for native, torch_ops in _native_against_torch_ops(llm, [prompt], 12):
        _assert_same_tokens_and_logprobs(native, torch_ops, 4, KV_TOLERANCES[kv_dtype])


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_every_c_path_decodes_over_a_16_bit_kv_cache(tiny_model, kernels, kv_dtype: str) -> None:
    """The C step of each build (VNNI, AVX2 and F16C, plain C: its own float16 conversions) over a
    16-bit cache, against the torch layers that widen the same cache."""
    from minisgl_engine.llm import LLM
    from minisgl_engine.models.native_decode import NativeDecoder

    folder, _ = tiny_model("qwen3")
    llm = LLM(str(folder), device="cpu", quantization="int8", max_kv_tokens=512, kv_dtype=kv_dtype)
    model = llm.engine.model
    model.model.native_decoder = NativeDecoder(model, llm.engine.kv_pool, kernels)
    prompt = [(5 * i) % 300 + 3 for i in range(90)]
    for native, torch_ops in _native_against_torch_ops(llm, [prompt], 12):
        _assert_same_tokens_and_logprobs(native, torch_ops, 4, KV_TOLERANCES[kv_dtype])


def test_every_c_path_rounds_kv_values_as_torch_does(kernels) -> None:
    """The C step stores each new token's K and V as torch's conversion would (nearest, ties to
    even; overflow to infinity), so the C and torch steps write the same bits into the cache."""
    gen = torch.Generator().manual_seed(4)
    x = torch.cat(
        [
            torch.randn(20_000, generator=gen) * scale
            for scale in (1e-7, 1e-5, 1e-2, 1.0, 300.0, 3e4)
        ]
        + [
            torch.tensor(
                [
                    65504.0,
                    65519.0,
                    65520.0,
                    -7e4,
                    0.0,
                    -0.0,
                    6e-8,
                    2.98e-8,
                    float("inf"),
                    -float("inf"),
                ]
            )
        ]
    )
    for kv_type, dtype in ((1, torch.float16), (2, torch.bfloat16)):
        stored, widened = torch.empty(x.numel(), dtype=torch.int16), torch.empty_like(x)
        kernels.kv_round_trip(
            x.data_ptr(), x.numel(), kv_type, stored.data_ptr(), widened.data_ptr()
        )
        assert torch.equal(stored, x.to(dtype).view(torch.int16)), dtype
        assert torch.equal(widened, x.to(dtype).float()), dtype


def test_packed_product_and_lookup_of_no_rows() -> None:
    """A prefill step in which no request samples asks the LM head for zero rows."""
    raw, reference = _blocks(T.Q8_0, rows=32)
    planes = planes_of(raw, int(T.Q8_0), tuple(reference.shape))
    assert PackedWeight(planes).matmul(torch.empty(0, 512)).shape == (0, 32)
    assert pack_weight(planes).matmul(torch.empty(0, 512)).shape == (0, 32)
    assert QuantizedRows(raw, int(T.Q8_0), 512).lookup(
        torch.empty(0, 4, dtype=torch.long), torch.float32
    ).shape == (0, 4, 512)


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
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=names_from)[
        "tensors"
    ]
    ours = {name: t.dequantize() if isinstance(t, GGUFTensor) else t for name, t in iter_gguf(path)}
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: transformers names the head too
    for name, tensor in ours.items():
        assert torch.equal(tensor.float(), torch.as_tensor(theirs[name]).float()), name


def test_gguf_index_reads_what_gguf_wrote(tmp_path) -> None:
    """The quick header reader against gguf's writer and reader on a written file: scalars,
    strings, string and number arrays skipped, an alignment of 64, each tensor's shape, type,
    place and bytes; a cut file is a WeightsError naming it."""
    import gguf

    from minisgl_engine.errors import WeightsError
    from minisgl_engine.weights.gguf_index import GGUFIndex
    from minisgl_engine.weights.gguf_tensors import iter_gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", 4)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.chat_template", "{{ messages }} é")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bé", "", "\u00ff" * 3] * 50)
    writer.add_array("tokenizer.ggml.scores", [0.5] * 7)
    writer.add_uint32("general.alignment", 64)
    rng = np.random.default_rng(0)
    floats = rng.standard_normal((8, 32), dtype=np.float32)
    blocks, _ = _blocks(T.Q8_0, rows=16)
    writer.add_tensor("token_embd.weight", floats)
    writer.add_tensor("output.weight", blocks.numpy(), raw_dtype=T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    index = GGUFIndex(path)
    assert index.metadata["llama.attention.head_count"] == 4
    assert index.metadata["tokenizer.ggml.add_bos_token"] is True
    assert index.metadata["tokenizer.chat_template"] == "{{ messages }} é"
    assert "tokenizer.ggml.tokens" not in index.metadata  # arrays are skipped
    reader = gguf.GGUFReader(str(path))
    ours = [(t.name, t.dims, t.qtype, t.offset, t.n_bytes) for t in index.tensors]
    assert ours == [
        (
            t.name,
            tuple(int(n) for n in t.shape.tolist()),
            int(t.tensor_type),
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reader.tensors
    ]
    tensors = dict(iter_gguf(path))
    assert torch.equal(tensors["model.embed_tokens.weight"], torch.from_numpy(floats))
    assert torch.equal(tensors["lm_head.weight"].raw, blocks)

    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(WeightsError, match="could not read GGUF file"):
        list(iter_gguf(path))


@pytest.fixture(params=["c-kernels", "torch-packed"])
def cpu_kernels(request, monkeypatch):
    """Our C kernels, or (as on a machine without a C compiler) torch's packed kernel."""
    from minisgl_engine.kernels import cpu_native

    if request.param == "torch-packed":
        monkeypatch.setenv("MINISGL_NATIVE", "0")
    cpu_native.native_kernels.cache_clear()
    yield request.param
    cpu_native.native_kernels.cache_clear()


@pytest.mark.parametrize("kind, tolerance", [("int8", 0.03), ("int4", 0.4)])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float_checkpoint_quantized_at_load(
    tiny_model, cpu_kernels, arch: str, kind: str, tolerance: float
) -> None:
    """``--quantization int8 | int4``: every projection and the tied or untied LM head packed;
    logits near the float32 engine's on the same weights. Random weights are the hard case for
    4 bits (a Gaussian group of 32 has no structure to keep): ~8% error per product, ~30% on the
    logits of this 2-layer model; 8 bits stay within a few percent."""
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model(arch)
    quantized = LLM(str(folder), device="cpu", quantization=kind, max_kv_tokens=512)
    reference = LLM(str(folder), device="cpu", quantization="none", max_kv_tokens=512)
    expected = NativeWeight if cpu_kernels == "c-kernels" else PackedWeight
    assert isinstance(quantized.engine.model.model.layers[0].self_attn.qkv_proj.quant, expected)
    assert quantized.engine.native_decode == (cpu_kernels == "c-kernels")
    ids = list(range(3, 40))
    logits = []
    for llm in (quantized, reference):
        captured = []
        hook = llm.engine.model.register_forward_hook(
            lambda mod, inp, out: captured.append(out.detach().clone())
        )
        from minisgl_engine.sampling_params import SamplingParams

        llm.generate(
            [ids[:n] for n in range(20, len(ids))], SamplingParams(max_tokens=1, temperature=0)
        )
        hook.remove()
        logits.append(torch.cat(captured))
    ours, ref = logits
    assert ours.shape == ref.shape
    assert ((ours - ref).norm() / ref.norm()).item() < tolerance
    # and decode steps (batch 1: the C step where the kernels are built)
    from minisgl_engine.sampling_params import SamplingParams

    [reply] = quantized.generate(
        [ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )
    assert len(reply.token_ids) == 8


def test_quantization_flags_that_cannot_apply_say_so(tiny_model) -> None:
    from minisgl_engine.errors import UserError
    from minisgl_engine.llm import LLM

    folder, _ = tiny_model("llama")
    with pytest.raises(UserError, match="quantization"):
        LLM(str(folder), device="cpu", quantization="int3")
