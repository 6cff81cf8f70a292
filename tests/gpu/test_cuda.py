"""The CUDA fast path (FlashInfer attention and fused kernels, CUDA graphs, overlap scheduling,
FlashInfer sampling) on a real GPU. Skipped without one (see conftest.py); run on the device
machine with ``pytest -m cuda``.

Correctness in bf16 is judged against transformers in float32 on the same weights, relative to
how far transformers' own bf16 run lands from it: random weights give near-ties, so no bf16
implementation matches float32 everywhere.
"""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest
import torch

pytestmark = pytest.mark.cuda

from minisgl_engine.config import EngineConfig  # noqa: E402
from minisgl_engine.llm import LLM  # noqa: E402
from minisgl_engine.sampling_params import SamplingParams  # noqa: E402

QWEN3_SHAPE = "qwen3-0.6b"


def engine_config(**overrides) -> EngineConfig:
    base = dict(
        dummy_weights=True,
        config=QWEN3_SHAPE,
        device="cuda",
        dtype="bfloat16",
        max_kv_tokens=40_000,
        max_running_requests=64,
        cuda_graph_max_bs=64,
        attn="flashinfer",
    )
    return EngineConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def reference_models():
    """transformers' Qwen3-0.6B-shape model with random weights, rounded to bf16 once, in
    float32 (the reference) and in bf16."""
    from transformers import AutoModelForCausalLM

    from minisgl_engine.model_loader import load_hf_config

    hf_config = load_hf_config(EngineConfig(config=QWEN3_SHAPE), None)
    torch.manual_seed(0)
    hf32 = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for p in hf32.parameters():
            p.copy_(p.to(torch.bfloat16).float())  # both runs see exactly the same weights
    hf16 = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    hf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in hf32.state_dict().items()})
    return hf32.cuda().eval(), hf16.cuda().eval()


def load_same_weights(llm: LLM, hf16) -> None:
    llm.engine.model.load_weights(hf16.state_dict().items())


def random_sequences(n: int, positions: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(0, 10000) for _ in range(rng.randrange(20, 200) + positions)]
        for _ in range(n)
    ]


@torch.inference_mode()
def hf_last_logits(model, seqs: list[list[int]], positions: int) -> torch.Tensor:
    rows = []
    for seq in seqs:
        out = model(torch.tensor([seq], device="cuda")).logits[0].float()
        rows.append(out[-positions - 1 : -1])  # the logits that predict the last `positions` tokens
    return torch.cat(rows)


def our_last_logits(llm: LLM, seqs: list[list[int]], positions: int) -> torch.Tensor:
    # the last `positions` tokens are fed one decode step at a time, all sequences batched
    logits = llm.score_batch(seqs, [len(s) - positions for s in seqs])
    return torch.cat([rows[-positions - 1 : -1] for rows in logits])


def agreement(logits: torch.Tensor, ref: torch.Tensor) -> float:
    return 100.0 * (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()


def rel_error(logits: torch.Tensor, ref: torch.Tensor) -> float:
    return ((logits - ref).norm() / ref.norm()).item()


POSITIONS = 32  # decode steps teacher-forced per sequence


@pytest.fixture(scope="module")
def agreement_baselines(reference_models):
    """The 64 sequences, float32 transformers' logits (the reference), and the two baselines:
    transformers' own bf16 run and our torch attention backend (no FlashInfer, no graphs)."""
    hf32, hf16 = reference_models
    seqs = random_sequences(64, POSITIONS, seed=1)
    ref = hf_last_logits(hf32, seqs, POSITIONS)
    hf_bf16 = hf_last_logits(hf16, seqs, POSITIONS)
    plain = LLM(config=engine_config(attn="torch", cuda_graph_max_bs=0))
    load_same_weights(plain, hf16)
    torch_backend = our_last_logits(plain, seqs, POSITIONS)
    del plain
    torch.cuda.empty_cache()
    return seqs, ref, {"transformers bf16": hf_bf16, "our torch backend": torch_backend}


@pytest.mark.parametrize(
    "decode_attention,page_size",
    [
        ("flashinfer", 0),
        ("triton", 0),
        ("fused", 0),  # the GPU's default page size (DEFAULT_PAGE_SIZE_GPU)
        ("flashinfer", 1),
        ("triton", 1),  # one token per page, as --page-size 1 (the default before)
    ],
)
def test_flashinfer_logits_agree_with_transformers_as_well_as_its_own_bf16(
    reference_models, agreement_baselines, decode_attention, page_size, monkeypatch
):
    """Prefill on FlashInfer, then 32 decode steps of 64 sequences in CUDA graphs, their
    attention on FlashInfer's decode kernel, on triton_kernels.decode_attention (which the
    engine uses for small batches: here forced for every graph size) or on the one kernel from
    qkv (decode_attention_qkv, MINISGL_DECODE_ATTENTION=fused: here forced likewise), over
    pages of the default size and of one token."""
    from minisgl_engine.attention import flashinfer_backend
    from minisgl_engine.engine import DEFAULT_PAGE_SIZE_GPU

    _, hf16 = reference_models
    seqs, ref, baselines = agreement_baselines
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", decode_attention)
    monkeypatch.setattr(
        flashinfer_backend, "TRITON_DECODE_MAX_BATCH", 1 << 30
    )  # fused: every graph size, as triton
    fast = LLM(config=engine_config(page_size=page_size))
    assert fast.engine.attn_name == "flashinfer" and fast.engine.uses_cuda_graphs
    assert fast.engine.page_size == (page_size or DEFAULT_PAGE_SIZE_GPU)
    assert ((64, "triton") in fast.engine.graph_runner.graphs) == (decode_attention != "flashinfer")
    assert fast.engine.attn_backend.decode_limits.fused == (decode_attention == "fused")
    load_same_weights(fast, hf16)
    ours = our_last_logits(fast, seqs, POSITIONS)
    del fast
    torch.cuda.empty_cache()

    figures = {
        name: (agreement(x, ref), rel_error(x, ref))
        for name, x in (("ours", ours), *baselines.items())
    }
    print(
        f"decode attention {decode_attention}, page size {page_size or DEFAULT_PAGE_SIZE_GPU}: top-1 agreement with float32 transformers (%), relative logit error:",
        figures,
    )
    assert ours.shape == ref.shape == (64 * POSITIONS, ref.shape[-1])
    for baseline in baselines:
        assert figures["ours"][0] >= figures[baseline][0] - 1.0, (baseline, figures)
        assert figures["ours"][1] <= 1.5 * figures[baseline][1], (baseline, figures)


@pytest.fixture(scope="module")
def fp8_baselines(reference_models, agreement_baselines):
    """For ``--kv-dtype fp8``, what it is measured against: transformers' bf16 run with each
    layer's K and V rounded to FP8 before attention (test_kv_fp8.py's attention function), and
    our torch backend with an FP8 pool."""
    from test_kv_fp8 import FP8_KV_ATTENTION, register_fp8_kv_attention

    _, hf16 = reference_models
    seqs, _, _ = agreement_baselines
    register_fp8_kv_attention()
    implementation = hf16.config._attn_implementation
    hf16.set_attn_implementation(FP8_KV_ATTENTION)
    try:
        hf_fp8 = hf_last_logits(hf16, seqs, POSITIONS)
    finally:
        hf16.set_attn_implementation(implementation)
    plain = LLM(config=engine_config(attn="torch", cuda_graph_max_bs=0, kv_dtype="fp8"))
    load_same_weights(plain, hf16)
    torch_backend = our_last_logits(plain, seqs, POSITIONS)
    del plain
    torch.cuda.empty_cache()
    return {
        "transformers bf16, K/V rounded to fp8": hf_fp8,
        "our torch backend, fp8 pool": torch_backend,
    }


@pytest.mark.parametrize("decode_attention", ["flashinfer", "triton", "fused"])
def test_fp8_kv_cache_agrees_as_well_as_transformers_with_its_kv_rounded_to_fp8(
    reference_models, agreement_baselines, fp8_baselines, decode_attention, monkeypatch
):
    """``--kv-dtype fp8`` on every attention path (FlashInfer's FP8 prefill and decode modules,
    the Triton decode kernels widening K/V as they load them, the fused kernel storing the new
    token's K/V rounded) against float32 transformers, as well as transformers' own bf16 run with
    FP8-rounded K/V gets. What FP8 costs against the bf16 pool is printed, not asserted: it is
    the option's price, reported in docs/benchmarks.md."""
    from minisgl_engine.attention import flashinfer_backend

    _, hf16 = reference_models
    seqs, ref, bf16_baselines = agreement_baselines
    monkeypatch.setenv("MINISGL_DECODE_ATTENTION", decode_attention)
    monkeypatch.setattr(flashinfer_backend, "TRITON_DECODE_MAX_BATCH", 1 << 30)
    fast = LLM(config=engine_config(kv_dtype="fp8"))
    assert fast.engine.kv_pool.k_cache.dtype == torch.float8_e4m3fn and fast.engine.uses_cuda_graphs
    assert ((64, "triton") in fast.engine.graph_runner.graphs) == (decode_attention != "flashinfer")
    load_same_weights(fast, hf16)
    ours = our_last_logits(fast, seqs, POSITIONS)
    del fast
    torch.cuda.empty_cache()

    figures = {
        name: (agreement(x, ref), rel_error(x, ref))
        for name, x in (
            ("ours, fp8 pool", ours),
            *fp8_baselines.items(),
            ("transformers bf16", bf16_baselines["transformers bf16"]),
        )
    }
    print(
        f"--kv-dtype fp8, decode attention {decode_attention}: top-1 agreement with float32 transformers (%), relative logit error:",
        figures,
    )
    for baseline in fp8_baselines:
        assert figures["ours, fp8 pool"][0] >= figures[baseline][0] - 1.0, (baseline, figures)
        assert figures["ours, fp8 pool"][1] <= 1.5 * figures[baseline][1], (baseline, figures)


@pytest.fixture(scope="module")
def fp8_weight_baseline(reference_models, agreement_baselines):
    """For ``--quantization fp8``: transformers' bf16 run with every decoder-layer projection's
    weight rounded to FP8 and back (each row scaled as layers/fp8.py does): what the weights'
    rounding alone costs, without our kernels or the activations' rounding."""
    from minisgl_engine.layers.fp8 import dequantize_fp8, quantize_fp8

    _, hf16 = reference_models
    seqs, _, _ = agreement_baselines
    saved = {}
    with torch.no_grad():
        for name, module in hf16.model.layers.named_modules():
            if isinstance(module, torch.nn.Linear):
                saved[name] = module.weight.detach().clone()
                module.weight.copy_(dequantize_fp8(*quantize_fp8(module.weight), torch.bfloat16))
        try:
            rounded = hf_last_logits(hf16, seqs, POSITIONS)
        finally:
            for name, module in hf16.model.layers.named_modules():
                if name in saved:
                    module.weight.copy_(saved[name])
    return rounded


def test_fp8_weights_agree_as_well_as_transformers_with_its_weights_rounded_to_fp8(
    reference_models, agreement_baselines, fp8_weight_baseline, tmp_path
):
    """``--quantization fp8`` as a user runs it: a bf16 checkpoint folder loaded and its
    projections turned to FP8 at load (the fused kernels then measured on them, CUDA graphs
    captured); 64 sequences prefilled (FP8 tensor-core products of per-token-scaled
    activations) and decoded 32 steps in batch (the same) against float32 transformers, as well
    as transformers' bf16 run with its weights rounded to FP8 gets; then a batch-1 reply
    through the one-row FP8 kernel equal to the batched one's tokens."""
    _, hf16 = reference_models
    seqs, ref, bf16_baselines = agreement_baselines
    hf16.save_pretrained(tmp_path)
    fast = LLM(
        config=engine_config(
            dummy_weights=False, config=None, model=str(tmp_path), quantization="fp8"
        )
    )
    qkv = fast.engine.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale is not None
    assert fast.engine.uses_cuda_graphs
    ours = our_last_logits(fast, seqs, POSITIONS)
    # four sequences one at a time: their decode steps are batch-1, the one-row FP8 kernel
    one_row = torch.cat([our_last_logits(fast, [seq], POSITIONS) for seq in seqs[:4]])
    plans = (qkv.gemv_plan, fast.engine.model.model.layers[0].mlp.gemv_plan)
    del fast
    torch.cuda.empty_cache()

    first = slice(0, 4 * POSITIONS)
    baseline_rows = fp8_weight_baseline[first]
    figures = {
        name: (agreement(x, ref[rows]), rel_error(x, ref[rows]))
        for name, x, rows in (
            ("ours, fp8 weights", ours, slice(None)),
            ("transformers bf16, weights rounded to fp8", fp8_weight_baseline, slice(None)),
            ("transformers bf16", bf16_baselines["transformers bf16"], slice(None)),
            ("ours, fp8 weights, batch 1 (4 sequences)", one_row, first),
            ("transformers rounded to fp8, the same 4", baseline_rows, first),
        )
    }
    print(
        f"--quantization fp8 (one-row plans {plans}): top-1 agreement with float32 transformers (%), relative logit error:",
        figures,
    )
    assert plans[0][0] > 0 and plans[1][0] > 0, plans  # batch 1 ran the one-row kernel
    # our products also round the activations to FP8 (per token, at several rows): allowed a
    # little more than the weights' rounding alone
    for ours_name, baseline_name, points in (
        ("ours, fp8 weights", "transformers bf16, weights rounded to fp8", 3.0),
        (
            "ours, fp8 weights, batch 1 (4 sequences)",
            "transformers rounded to fp8, the same 4",
            5.0,
        ),
    ):
        assert figures[ours_name][0] >= figures[baseline_name][0] - points, figures
        assert figures[ours_name][1] <= 2.0 * figures[baseline_name][1], figures


def rounded_to_groups(hf16, kind: str) -> torch.Tensor:
    """Logits of transformers' bf16 run with every decoder-layer projection's weight rounded as
    ``--quantization int4 | int8`` rounds it (layers/quantized.py) and widened back: what the
    weights' rounding alone costs."""
    from minisgl_engine.layers.quantized import quantize_float

    saved = {}
    with torch.no_grad():
        for name, module in hf16.model.layers.named_modules():
            if isinstance(module, torch.nn.Linear):
                saved[name] = module.weight.detach().clone()
                widened = quantize_float(module.weight.float(), kind).dequantize()
                module.weight.copy_(widened.to(torch.bfloat16))
        try:
            return hf_last_logits(hf16, GROUP_SEQS, POSITIONS)
        finally:
            for name, module in hf16.model.layers.named_modules():
                if name in saved:
                    module.weight.copy_(saved[name])


GROUP_SEQS = random_sequences(16, POSITIONS, seed=7)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_group_quantized_weights_agree_as_well_as_transformers_with_the_same_rounding(
    kind, reference_models, tmp_path
):
    """``--quantization int4 | int8`` on the GPU as a user runs it (a bf16 checkpoint folder):
    every decoder projection held as group codes (layers/quantized_gpu.py), batch-1 decode in
    the one-row group kernel, prefill on the widened weight; against float32 transformers, as
    well as transformers' bf16 run with the same weights rounded the same way."""
    hf32, hf16 = reference_models
    ref = hf_last_logits(hf32, GROUP_SEQS, POSITIONS)
    baseline = rounded_to_groups(hf16, kind)
    hf16.save_pretrained(tmp_path)
    llm = LLM(
        config=engine_config(
            dummy_weights=False, config=None, model=str(tmp_path), quantization=kind
        )
    )
    from minisgl_engine.layers.quantized_gpu import GpuGroupWeight

    layer = llm.engine.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj.quant, GpuGroupWeight)
    assert isinstance(layer.mlp.gate_up_proj.quant, GpuGroupWeight)
    assert llm.engine.uses_cuda_graphs and llm.engine.quantization == kind
    batched = our_last_logits(llm, GROUP_SEQS, POSITIONS)
    one_row = torch.cat([our_last_logits(llm, [seq], POSITIONS) for seq in GROUP_SEQS[:4]])
    weight_gib = llm.engine.weight_bytes / 2**30
    del llm
    torch.cuda.empty_cache()
    first = slice(0, 4 * POSITIONS)
    figures = {
        f"ours, {kind}": (agreement(batched, ref), rel_error(batched, ref)),
        f"transformers bf16, weights rounded to {kind}": (
            agreement(baseline, ref),
            rel_error(baseline, ref),
        ),
        f"ours, {kind}, batch 1 (4 sequences)": (
            agreement(one_row, ref[first]),
            rel_error(one_row, ref[first]),
        ),
        "transformers rounded, the same 4": (
            agreement(baseline[first], ref[first]),
            rel_error(baseline[first], ref[first]),
        ),
    }
    print(f"--quantization {kind} ({weight_gib:.2f} GiB of weights held):", figures)
    for ours_name, baseline_name in (
        (f"ours, {kind}", f"transformers bf16, weights rounded to {kind}"),
        (f"ours, {kind}, batch 1 (4 sequences)", "transformers rounded, the same 4"),
    ):
        assert figures[ours_name][0] >= figures[baseline_name][0] - 3.0, figures
        assert figures[ours_name][1] <= 1.5 * figures[baseline_name][1], figures


def test_a_checkpoint_quantized_at_load_never_holds_its_16_bit_weights_on_the_gpu(
    reference_models, tmp_path
):
    """``--quantization int4`` of a bf16 checkpoint folder: read into host memory, each matrix
    sent to the GPU quantized, so the GPU's peak during the load stays under the 16-bit
    weights' size (what lets a model too big for the card in bf16 load quantized)."""
    from minisgl_engine.model_loader import load_model, param_bytes

    _, hf16 = reference_models
    hf16.save_pretrained(tmp_path)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loaded = load_model(
        engine_config(dummy_weights=False, config=None, model=str(tmp_path), quantization="int4")
    )
    peak = torch.cuda.max_memory_allocated() - before
    bf16 = param_bytes(loaded.config, torch.bfloat16)
    print(
        f"int4 load: GPU peak {peak / 2**20:.0f} MiB, held {loaded.weight_bytes / 2**20:.0f} MiB, bf16 weights {bf16 / 2**20:.0f} MiB"
    )
    assert loaded.model.model.embed_tokens.weight.is_cuda
    assert loaded.weight_bytes < 0.6 * bf16 and peak < 0.75 * bf16, (peak, bf16)


def test_a_gguf_stays_quantized_on_the_gpu_and_agrees_with_its_widened_weights():
    """The demo GGUF (or the GGUF model folder named by MINISGL_GPU_GGUF_MODEL: the device
    carries a few layers of it, scripts/gguf_shrink.py) served on the GPU with ``--quantization
    gguf`` keeps its blocks (group codes: the projections under 3/4 of their bf16 bytes) and agrees
    with the same file widened to bf16, both judged against the file widened to float32."""
    import os

    from minisgl_engine.layers.quantized_gpu import GpuGroupWeight
    from minisgl_engine.weights.demo import demo_model_dir

    folder = os.environ.get("MINISGL_GPU_GGUF_MODEL") or str(demo_model_dir())
    if not (demo_model_dir() / ".complete").exists() and folder == str(demo_model_dir()):
        pytest.skip("the demo model is not in the cache (run `minisgl-chat pull` first)")
    seqs = [[t % 40000 for t in seq] for seq in GROUP_SEQS]
    demo = dict(dummy_weights=False, config=None, model=folder, max_kv_tokens=20_000)
    runs, held = {}, {}
    for name, overrides in (
        (
            "float32, widened",
            dict(dtype="float32", quantization="none", attn="torch", cuda_graph_max_bs=0),
        ),
        ("bf16, widened", dict(quantization="none")),
        ("bf16, kept quantized", dict(quantization="gguf")),
    ):
        llm = LLM(config=engine_config(**demo, **overrides))
        if name == "bf16, kept quantized":
            assert llm.engine.quantization == "gguf"
            assert isinstance(llm.engine.model.model.layers[0].mlp.down_proj.quant, GpuGroupWeight)
        runs[name] = our_last_logits(llm, seqs, POSITIONS).float()
        projections = [
            m for m in llm.engine.model.model.layers.modules() if hasattr(m, "quant")
        ]  # the decoder layers' Linear modules: the embedding stays widened either way
        held[name] = round(
            sum(m.quant.nbytes if m.quant is not None else m.weight.nbytes for m in projections)
            / 2**20,
            2,
        )
        del llm
        torch.cuda.empty_cache()
    ref = runs["float32, widened"]
    figures = {name: (agreement(x, ref), rel_error(x, ref)) for name, x in runs.items()}
    print(
        "demo GGUF on the GPU: agreement with float32 (%), relative error; MiB held:", figures, held
    )
    assert held["bf16, kept quantized"] < 0.75 * held["bf16, widened"], held
    kept, widened = figures["bf16, kept quantized"], figures["bf16, widened"]
    assert kept[0] >= widened[0] - 3.0 and kept[1] <= 1.5 * widened[1] + 1e-3, figures


@pytest.fixture(scope="module")
def graph_llm():
    # the default rules: graphs of up to 16 rows attend with the Triton kernels (FlashInfer for
    # long contexts); from DECODE_WHOLE_KV_FROM rows FlashInfer reads K/V whole (split for long contexts)
    llm = LLM(
        config=engine_config(max_running_requests=256, cuda_graph_max_bs=256, max_kv_tokens=200_000)
    )
    llm.scheduler.overlap = False
    return llm


@pytest.mark.parametrize(
    "batch_size,kind,prompt_lens",
    [
        (1, "triton", (5, 80)),
        (3, "triton", (5, 80)),
        (3, "flashinfer", (5, 80)),
        (64, "whole", (5, 80)),
        (200, "whole", (5, 80)),
        (
            64,
            "whole",
            (300, 800),
        ),  # long enough that the split plan cuts each request's K/V into several chunks
        (64, "flashinfer", (2_100, 2_400)),  # longer than DECODE_WHOLE_KV_MAX_CONTEXT: split
        (1, "triton", (3_500, 4_000)),
        (5, "triton", (2_000, 4_000)),  # long contexts: every one of the pieces holds tokens
    ],
)
def test_cuda_graph_replay_equals_eager_at_the_padded_size(
    graph_llm, batch_size, kind, prompt_lens, monkeypatch
):
    """Each graph against the same batch run eagerly with the same padding (and so the same
    attention); small graphs exist twice (attention on the Triton kernels for short contexts, on
    FlashInfer for long ones: here forced by the limit), large ones too (K/V read whole for short
    contexts, split for long ones), and the step replays the one it should."""
    from dataclasses import replace

    sched, engine = graph_llm.scheduler, graph_llm.engine
    backend = engine.attn_backend
    if (
        kind == "flashinfer" and batch_size <= backend.decode_limits.max_batch
    ):  # every request is "long"
        monkeypatch.setattr(backend, "decode_limits", replace(backend.decode_limits, max_context=0))
    rng = random.Random(batch_size)
    uids = list(range(10_000 * batch_size, 10_000 * batch_size + batch_size))
    for uid in uids:
        ids = [rng.randrange(0, 10000) for _ in range(rng.randrange(*prompt_lens))]
        sched.add_request(uid, ids, SamplingParams(max_tokens=100, ignore_eos=True))
    while len(sched.decode_manager.running) < batch_size or sched.prefill_manager.waiting:
        sched.step()  # prefill everyone (and decode those already running)
    try:
        for _ in range(3):
            batch = sched.schedule()  # the decode batch, with a KV slot for each new token
            assert batch.is_decode and batch.size == batch_size
            size = engine.graph_size(batch)
            assert size is not None and size >= batch_size
            eager = engine.forward_logits(batch, use_graph=False, pad_to=size)
            replay = engine.forward_logits(batch, use_graph=True)
            assert engine.graph_runner.last_graph == (size, kind)
            print(
                f"batch {batch_size} (graph of {size}, {kind}): max |eager - replay| = {(eager - replay).abs().max().item():.3g}"
            )
            assert torch.equal(eager.argmax(-1), replay.argmax(-1)), (
                f"batch {batch_size} (graph of {size})"
            )
            if (
                size >= backend.decode_limits.whole_kv_rows and backend.decode_tensor_cores
            ):  # K/V whole against split
                # FlashInfer 0.6's PrefillPlanInfo: its last field says whether the plan split K/V
                # (under CUDA graphs its own plan always does)
                assert backend.graph_wrappers[size, kind]._plan_info[-1] == (kind == "flashinfer")
                other = "flashinfer" if kind == "whole" else "whole"
                limits = backend.decode_limits
                backend.decode_limits = replace(
                    limits, whole_kv_max_context=0 if other == "flashinfer" else 1 << 30
                )
                try:
                    planned_other = engine.forward_logits(batch, use_graph=False, pad_to=size)
                    assert backend.graph_wrappers[size, other]._plan_info[-1] == (
                        other == "flashinfer"
                    )
                finally:
                    backend.decode_limits = limits
                same = (replay.argmax(-1) == planned_other.argmax(-1)).float().mean().item()
                print(
                    f"batch {batch_size}: K/V read {kind} vs {other}, relative error {rel_error(replay, planned_other):.3g}, same top-1 {same:.1%}"
                )
                assert rel_error(replay, planned_other) < 0.02 and same >= 0.98
            if kind == "triton":  # the Triton decode kernels against FlashInfer's, same padding
                limits = backend.decode_limits
                backend.decode_limits = replace(limits, max_context=0)  # every request "long"
                try:
                    flashinfer = engine.forward_logits(batch, use_graph=False, pad_to=size)
                finally:
                    backend.decode_limits = limits
                print(
                    f"batch {batch_size}: Triton decode attention vs FlashInfer, relative error {rel_error(replay, flashinfer):.3g}"
                )
                assert rel_error(replay, flashinfer) < 0.05
            sched.step()  # advance every request one token
    finally:
        for uid in uids:
            sched.abort_request(uid)
        sched.drain()
    kv = sched.cache_manager.stats()
    assert kv.used == 0 and kv.used + kv.cached + kv.free == kv.total


def test_mixed_prefill_decode_chunks_and_aborts_return_every_page():
    llm = LLM(config=engine_config(max_prefill_tokens=256, max_kv_tokens=30_000))
    sched = llm.scheduler
    assert sched.overlap
    rng = random.Random(7)
    uids = list(range(500, 560))
    finished: dict[int, str] = {}
    pending = list(uids)
    steps = 0
    while pending or sched.has_work:
        for _ in range(rng.randrange(0, 4)):  # requests keep arriving while others decode
            if pending:
                uid = pending.pop()
                n = rng.choice(
                    [rng.randrange(5, 60), rng.randrange(300, 1500)]
                )  # long ones are chunked
                greedy = rng.random() < 0.5
                params = SamplingParams(
                    max_tokens=rng.randrange(1, 80),
                    temperature=0.0 if greedy else 0.8,
                    top_k=rng.choice([-1, 20]),
                    top_p=rng.choice([1.0, 0.9]),
                    seed=rng.choice([None, 5]),
                    ignore_eos=True,
                )
                sched.add_request(uid, [rng.randrange(0, 10000) for _ in range(n)], params)
        for out in sched.step():
            if out.finished:
                finished[out.uid] = out.finish_reason.value
        steps += 1
        live = [uid for uid in uids if uid in sched.reqs]
        if live and rng.random() < 0.15:
            out = sched.abort_request(rng.choice(live))
            finished[out.uid] = out.finish_reason.value
        kv = sched.cache_manager.stats()
        assert kv.used + kv.cached + kv.free == kv.total
    sched.drain()
    assert set(finished) == set(uids)
    assert {"abort", "length"} <= set(finished.values())
    kv = sched.cache_manager.stats()
    assert kv.used == 0 and kv.used + kv.cached + kv.free == kv.total
    assert llm.engine.page_table.num_free_rows == sched.max_running_requests


@pytest.mark.parametrize("kind", ["channel", "block"])
def test_an_fp8_checkpoint_is_held_in_fp8_on_the_gpu(kind, tiny_model, tmp_path):
    """A checkpoint stored in FP8 (tests/unit/test_fp8_checkpoint.py's two layouts) runs as
    ``--quantization fp8`` by default on a GPU: a per-channel one with its stored codes and row
    scales installed as they are, a per-block one widened and rounded once more to per-row
    scales; its logits within FP8's rounding of the float checkpoint holding the weights it
    means."""
    from safetensors.torch import load_file
    from test_fp8_checkpoint import write_fp8_pair

    from minisgl_engine.layers.fp8 import dequantize_fp8

    source, _ = tiny_model("qwen3")
    fp8_dir, float_dir = write_fp8_pair(source, tmp_path, kind)
    fast = LLM(str(fp8_dir), device="cuda", dtype="bfloat16", cuda_graph_max_bs=4)
    assert fast.engine.quantization == "fp8"
    qkv_proj = fast.engine.model.model.layers[0].self_attn.qkv_proj
    assert qkv_proj.weight.dtype == torch.float8_e4m3fn
    meant = load_file(float_dir / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    rows = meant.shape[0]
    if kind == "channel":
        stored = load_file(fp8_dir / "model.safetensors")
        codes = stored["model.layers.0.self_attn.q_proj.weight"]
        scale = stored["model.layers.0.self_attn.q_proj.weight_scale"].reshape(-1)
        assert torch.equal(qkv_proj.weight[:rows].cpu().view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(qkv_proj.weight_scale[:rows].cpu(), scale.float())
    held = dequantize_fp8(qkv_proj.weight, qkv_proj.weight_scale, torch.float32)[:rows]
    error = (held.cpu() - meant).abs().max().item() / meant.abs().max().item()
    assert error <= (0 if kind == "channel" else 0.07), error
    seqs = [[3, 17, 42, 99, 5, 250, 8], [7, 7, 300, 12]]
    ours = fast.score_batch(seqs)
    del fast
    plain = LLM(str(float_dir), device="cuda", dtype="bfloat16", cuda_graph_max_bs=4)
    assert plain.engine.quantization == "none"
    for got, want in zip(ours, plain.score_batch(seqs)):
        assert ((got - want).norm() / want.norm()).item() < 0.1


@pytest.mark.parametrize(
    "method, group, symmetric, fmt", [("awq", 128, False, "gemm"), ("gptq", 128, True, "gptq")]
)
def test_an_int4_checkpoint_keeps_its_codes_on_the_gpu(method, group, symmetric, fmt, tmp_path):
    """An AWQ/GPTQ checkpoint (tests/int4_checkpoints.py's packer, checked against the reference
    packers by tests/unit/test_int4_checkpoint.py) runs by default as group codes on the GPU:
    4-bit, widening to the weights meant (exactly for symmetric zero points, else within the
    float16 rounding of the offsets); logits near the float checkpoint's in bf16."""
    from int4_checkpoints import make_wide_tiny_model, write_int4_pair
    from safetensors.torch import load_file

    from minisgl_engine.layers.quantized_gpu import GpuGroupWeight

    source = make_wide_tiny_model(tmp_path / "source")
    quant_dir, float_dir = write_int4_pair(source, tmp_path, method, group, symmetric, fmt)
    fast = LLM(str(quant_dir), device="cuda", dtype="bfloat16", cuda_graph_max_bs=4)
    assert fast.engine.quantization == method
    qkv = fast.engine.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant, GpuGroupWeight)
    assert qkv.quant.layout.kind == 4
    meant = load_file(float_dir / "model.safetensors")
    want = torch.cat([meant[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    held = qkv.quant.widened(torch.float32).cpu()
    if symmetric:
        assert torch.equal(held, want)
    else:
        assert (held - want).abs().max() <= 2.0**-10 * want.abs().max()
    seqs = [[3, 17, 42, 99, 5, 250, 8], [7, 7, 300, 12]]
    ours = fast.score_batch(seqs)
    del fast
    plain = LLM(str(float_dir), device="cuda", dtype="bfloat16", cuda_graph_max_bs=4)
    for got, ref in zip(ours, plain.score_batch(seqs)):
        assert ((got - ref).norm() / ref.norm()).item() < 0.05


def test_an_engine_dropped_in_a_reference_cycle_does_not_break_a_later_capture(monkeypatch):
    """An LLM deleted while in a reference cycle is freed by Python's collector, whenever it
    runs; freeing its CUDA graphs inside another engine's capture invalidated that capture and
    broke the CUDA generator for the rest of the process (seen in `scripts/gpu_check.sh verify`:
    one failed capture, then every later engine's start failed). The collector is made to run
    inside every capture here, as it may at any allocation."""
    import gc

    first = LLM(config=engine_config(max_kv_tokens=8_000, cuda_graph_max_bs=4))
    first.engine.back_reference = first  # only the collector frees it now
    del first
    begin = torch.cuda.CUDAGraph.capture_begin

    def begin_then_collect(self, *args, **kwargs):
        begin(self, *args, **kwargs)
        gc.collect()

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", begin_then_collect)
    second = LLM(config=engine_config(max_kv_tokens=8_000, cuda_graph_max_bs=4))
    assert second.engine.uses_cuda_graphs
    reply = second.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(reply.token_ids) == 8
    torch.randn(4, device="cuda")  # the generator still works outside a capture


def test_serve_on_cuda_answers_paris(tmp_path):
    """The app's server on the GPU with the demo model (prepared beforehand in
    MINISGL_CACHE_DIR: the device has no network)."""
    from server_utils import ServerProcess, wait_until

    from minisgl_engine.weights.demo import DEMO_MODEL_NAME, demo_model_dir

    if not (demo_model_dir() / ".complete").exists():
        pytest.skip("the demo model is not in the cache (run `minisgl-chat pull` first)")
    server = ServerProcess("--device", "cuda", timeout=600, log_path=tmp_path / "serve.log")
    try:
        body = {
            "model": DEMO_MODEL_NAME,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 32,
            "temperature": 0,
            "stream": True,
        }
        text, lines = "", []
        with httpx.stream(
            "POST", f"{server.url}/v1/chat/completions", json=body, timeout=120
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    text += delta.get("content") or ""
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines
        print("answer:", text)
        assert "Paris" in text
        assert wait_until(lambda: "ready at" in server.output(), 10)
        print(server.output())
        ready = re.search(
            r"attention flashinfer, (\d+) CUDA graphs captured in [\d.]+ s, overlap scheduling",
            server.output(),
        )
        assert ready is not None and int(ready.group(1)) > 0
    finally:
        server.stop()
