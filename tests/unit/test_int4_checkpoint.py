"""AWQ and GPTQ 4-bit checkpoints (weights/int4_config.py, weights/int4_checkpoint.py): matrices
packed by the reference packers (AutoAWQ 0.2.9, AutoGPTQ 0.7.1, GPTQModel 7.7.0's v2 zero words;
tests/data/int4_reference.safetensors, made by scripts/int4_reference_fixtures.py) unpack to the
references' own dequantization; our test packer (tests/int4_checkpoints.py) writes their words;
tiny models packed by it load with the logits of the float checkpoint of the weights they mean,
widened (--quantization none) and held as group codes (auto, CPU); unsupported variants are
one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from int4_checkpoints import make_wide_tiny_model, pack_awq, pack_gptq, write_int4_pair
from safetensors import safe_open

from minisgl_engine.config import EngineConfig
from minisgl_engine.errors import UserError, WeightsError
from minisgl_engine.layers.quantized import held_exactly, int4_checkpoint_planes
from minisgl_engine.llm import LLM
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.weights.int4_checkpoint import unpack_awq, unpack_gptq
from minisgl_engine.weights.int4_config import Int4Checkpoint, int4_checkpoint_format

REFERENCE = Path(__file__).parent.parent / "data" / "int4_reference.safetensors"


def reference_variants() -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
    with safe_open(str(REFERENCE), "pt") as f:
        described = json.loads(f.metadata()["variants"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return {
        name: (
            config,
            {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(name + ".")},
        )
        for name, config in described.items()
    }


VARIANTS = reference_variants()


def unpacked(config: dict, parts: dict[str, torch.Tensor]):
    if config["quant_method"] == "awq":
        return unpack_awq(parts["qweight"], parts["qzeros"], parts["scales"])
    historical = config["checkpoint_format"] == "gptq"
    return unpack_gptq(
        parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], int(historical)
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_reference_packing_unpacks_to_the_references_own_dequantization(name):
    """Ours is (code - zero) * scale exactly in float32; the references compute it in float16,
    so ours rounded to float16 is theirs, bit for bit (a wrong nibble, zero or scale column
    would be off by a whole step)."""
    config, parts = VARIANTS[name]
    weight = unpacked(config, parts)
    group = config["group_size"]
    assert weight.group_size == (weight.shape[1] if group == -1 else group)
    ours = weight.dequantize()
    theirs = parts["dequantized"]
    assert ours.shape == theirs.shape
    assert torch.equal(ours.half(), theirs)
    if not config.get("sym", False):  # asymmetric: the zero points really vary
        assert weight.zeros.unique().numel() > 1


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_test_packer_writes_the_reference_packers_words(name):
    """tests/int4_checkpoints.py's packer is the inverse of our unpacking and writes the very
    words the references wrote: checkpoints it makes stand for real exports."""
    config, parts = VARIANTS[name]
    weight = unpacked(config, parts)
    if config["quant_method"] == "awq":
        packed = pack_awq(weight)
    else:
        packed = pack_gptq(weight, historical=config["checkpoint_format"] == "gptq")
        assert torch.equal(packed["g_idx"], parts["g_idx"].to(torch.int32))
    for part in ("qweight", "qzeros", "scales"):
        assert torch.equal(packed[part], parts[part]), part


@pytest.mark.parametrize("name", list(VARIANTS))
def test_group_codes_hold_each_reference_matrix_in_four_bits(name):
    """One 4-bit plane, offset -zero * scale: exact for symmetric zero points (8); other zero
    points' offsets need more bits than float16 has and are rounded, within 2^-11 of
    zero * scale (a small part of a quantization step, the scale)."""
    config, parts = VARIANTS[name]
    weight = unpacked(config, parts)
    planes = int4_checkpoint_planes([weight])
    assert planes.num_planes == 1 and held_exactly(planes)  # what the layout stores, as is
    held, meant = planes.dequantize(), weight.dequantize()
    if config.get("sym"):
        assert torch.equal(held, meant)
        return
    per_weight = lambda t: t.float().repeat_interleave(weight.group_size, dim=1)  # noqa: E731
    zero_times_scale = (per_weight(weight.zeros) * per_weight(weight.scales)).abs()
    assert ((held - meant).abs() <= 2.0**-11 * zero_times_scale).all()
    assert ((held - meant).abs() <= 0.01 * per_weight(weight.scales)).all()
    assert not torch.equal(held, meant)  # rounded somewhere (see the next test)


def test_an_asymmetric_matrix_is_not_held_in_four_bits_exactly():
    """Why its offsets are rounded: a zero point times a float16 scale rounds in float16."""
    from minisgl_engine.layers.quantized import _zero_point_plane

    config, parts = VARIANTS["awq_g128"]
    assert not held_exactly(_zero_point_plane(unpacked(config, parts)))


@pytest.fixture(scope="module")
def wide_source(tmp_path_factory):
    return make_wide_tiny_model(tmp_path_factory.mktemp("wide-qwen3"))


CHECKPOINTS = [
    ("awq", 128, False, "gemm"),
    ("gptq", 128, True, "gptq"),
    ("gptq", 64, False, "gptq_v2"),
    ("gptq", 32, False, "gptq"),
]
SEQS = [[3, 17, 42, 99, 5, 250, 8], [7, 7, 300, 12]]


def greedy(llm: LLM, n: int = 8) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    return [r.token_ids for r in llm.generate([s[:5] for s in SEQS], params)]


@pytest.mark.parametrize("method, group, symmetric, fmt", CHECKPOINTS)
def test_a_checkpoint_widened_at_load_gives_the_logits_of_the_weights_it_means(
    wide_source, tmp_path, method, group, symmetric, fmt
):
    """--quantization none: every matrix widened exactly as read; the logits are those of our
    float32 engine and (float32 KV cache; test_model_parity.py's tolerance) of transformers on
    the float checkpoint of the dequantized weights."""
    from transformers import AutoModelForCausalLM

    quant_dir, float_dir = write_int4_pair(wide_source, tmp_path, method, group, symmetric, fmt)
    assert int4_checkpoint_format(quant_dir).method == method
    kw = dict(device="cpu", dtype="float32", kv_dtype="float32")
    ours = LLM(str(quant_dir), quantization="none", **kw)
    assert ours.engine.quantization == "none"
    plain = LLM(str(float_dir), **kw)
    hf = AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32).eval()
    for seq, got, want in zip(SEQS, ours.score_batch(SEQS), plain.score_batch(SEQS)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            reference = hf(torch.tensor([seq])).logits[0]
        assert (got - reference).abs().max() <= 1e-4 * reference.abs().max() + 1e-5
    assert greedy(ours) == greedy(plain)


@pytest.mark.parametrize("method, group, symmetric, fmt", CHECKPOINTS)
def test_a_checkpoint_keeps_its_codes_on_the_cpu_exactly(
    wide_source, tmp_path, method, group, symmetric, fmt
):
    """--quantization auto on a CPU: the projections held as 4-bit group codes whose widened
    weights are the ones meant (exactly for symmetric zero points, else within the float16
    rounding of the offsets); the logits within the C kernels' 8-bit rounding of the activations
    of the float checkpoint's, and the same greedy tokens."""
    from minisgl_engine.layers.quantized import NativeWeight

    quant_dir, float_dir = write_int4_pair(wide_source, tmp_path, method, group, symmetric, fmt)
    kept = LLM(str(quant_dir), device="cpu", dtype="float32")
    assert kept.engine.quantization == method
    qkv = kept.engine.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.is_meta and qkv.quant is not None
    from safetensors.torch import load_file

    meant = load_file(float_dir / "model.safetensors")
    want = torch.cat([meant[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    if isinstance(qkv.quant, NativeWeight):
        assert qkv.quant.kind == 4
        held = torch.empty(want.shape)
        qkv.quant.lib.qdequantize(qkv.quant.struct, 0, want.shape[0], held.data_ptr())
        if symmetric:
            assert torch.equal(held, want)
        else:  # a 4-bit step is ~1/7 of the largest weight; the offsets' rounding far under it
            assert (held - want).abs().max() <= 2.0**-10 * want.abs().max()
    plain = LLM(str(float_dir), device="cpu", dtype="float32")
    for got, ref in zip(kept.score_batch(SEQS), plain.score_batch(SEQS)):
        assert ((got - ref).norm() / ref.norm()).item() < 0.02
    assert greedy(kept) == greedy(plain)


def test_quantization_flags_on_a_4_bit_checkpoint(wide_source, tmp_path):
    from minisgl_engine.model_loader import choose_quantization

    cpu = torch.device("cpu")
    assert choose_quantization(EngineConfig(quantization="auto"), cpu, "awq") == "awq"
    assert choose_quantization(EngineConfig(quantization="none"), cpu, "gptq") == "none"
    with pytest.raises(UserError, match="a GPTQ checkpoint is already quantized"):
        choose_quantization(EngineConfig(quantization="int4"), cpu, "gptq")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bits": 3}, r"stores 3-bit weights \(bits: 3"),
        ({"desc_act": True}, r"act-order \(desc_act: true"),
        ({"group_size": 16}, "group_size is 16"),
        ({"checkpoint_format": "marlin"}, r"stored as 'marlin' \(checkpoint_format"),
    ],
)
def test_an_unsupported_gptq_checkpoint_is_a_one_line_error(tmp_path, change, message):
    folder = tmp_path / "model"
    folder.mkdir()
    quant = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    (folder / "config.json").write_text(json.dumps({"quantization_config": {**quant, **change}}))
    with pytest.raises(WeightsError, match=message) as caught:
        int4_checkpoint_format(folder)
    assert "\n" not in str(caught.value)


def test_an_awq_checkpoint_of_another_packing_is_a_one_line_error(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}
    (folder / "config.json").write_text(json.dumps({"quantization_config": quant}))
    with pytest.raises(WeightsError, match="'gemv' kernels"):
        int4_checkpoint_format(folder)
    quant["version"] = "GEMM"
    (folder / "config.json").write_text(json.dumps({"quantization_config": quant}))
    assert int4_checkpoint_format(folder) == Int4Checkpoint("awq", 128)


def test_an_old_gptq_export_is_read_from_its_quantize_config_json(tmp_path):
    """AutoGPTQ's exports before transformers' quantization_config kept the settings in
    quantize_config.json; GPTQModel's AWQ exports name the packing "format"."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    settings = {"bits": 4, "group_size": 64, "desc_act": False, "sym": False}
    (folder / "quantize_config.json").write_text(json.dumps(settings))
    assert int4_checkpoint_format(folder) == Int4Checkpoint("gptq", 64, False, zero_offset=1)
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "format": "gemv_fast"}
    (folder / "config.json").write_text(json.dumps({"quantization_config": quant}))
    with pytest.raises(WeightsError, match="'gemv_fast' kernels"):
        int4_checkpoint_format(folder)


def test_an_act_order_g_idx_is_refused_even_where_the_config_does_not_say_so(wide_source, tmp_path):
    quant_dir, _ = write_int4_pair(wide_source, tmp_path, "gptq", 128, True, "gptq")
    from safetensors.torch import load_file, save_file

    tensors = load_file(quant_dir / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()
    save_file(tensors, quant_dir / "model.safetensors")
    with pytest.raises(WeightsError, match=r"down_proj\.qweight: .*act-order"):
        LLM(str(quant_dir), device="cpu", dtype="float32")


def test_the_cli_refuses_an_unsupported_checkpoint_in_one_line_with_exit_code_2(tmp_path):
    """As `serve --model` and `generate --model` check a folder before loading it
    (api/server.prepare_model): exit code 2, one line saying what to use."""
    from minisgl_engine.api.server import prepare_model

    folder = tmp_path / "model"
    make_wide_tiny_model(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "desc_act": True}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="desc_act"):
        prepare_model(EngineConfig(model=str(folder), device="cpu"))
    proc = subprocess.run(
        [sys.executable, "-m", "minisgl_app.cli", "generate", "--model", str(folder), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "desc_act" in proc.stderr and "use a GPTQ export with desc_act false" in proc.stderr
