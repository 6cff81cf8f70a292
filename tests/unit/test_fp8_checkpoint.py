"""Checkpoints stored in FP8 in the Hugging Face layouts (weights/fp8_checkpoint.py): a tiny
Qwen3 written as llm-compressor's per-channel layout and as transformers' per-block layout loads
(on the CPU, widened) with exactly the logits of the float checkpoint holding the same weights,
widened here independently; a weight without its scale is a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisgl_engine.errors import WeightsError
from minisgl_engine.llm import LLM
from minisgl_engine.weights.fp8_checkpoint import Fp8Checkpoint, fp8_checkpoint_format

FP8 = torch.float8_e4m3fn
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = (48, 48)  # tiles the tiny model's 64- and 128-wide matrices with ragged last blocks

CHANNEL_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}
BLOCK_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": list(BLOCK),
}


def to_fp8(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(FP8 codes, the stored scale, the weight those two mean) in ``kind``'s layout."""
    rows, cols = weight.shape
    if kind == "channel":
        scale = weight.abs().amax(dim=1, keepdim=True) / 448  # [out, 1], as llm-compressor
        codes = (weight / scale).to(FP8)
        return codes, scale, codes.float() * scale
    br, bc = BLOCK
    blocks = torch.zeros(-(-rows // br), -(-cols // bc))
    meant = torch.empty(rows, cols)
    codes = torch.empty(rows, cols, dtype=FP8)
    for i in range(blocks.shape[0]):
        for j in range(blocks.shape[1]):
            part = weight[i * br : (i + 1) * br, j * bc : (j + 1) * bc]
            blocks[i, j] = part.abs().max() / 448
            q = (part / blocks[i, j]).to(FP8)
            codes[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = q
            meant[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = q.float() * blocks[i, j]
    return codes, blocks, meant


def write_fp8_pair(source: Path, folder: Path, kind: str) -> tuple[Path, Path]:
    """The tiny checkpoint in FP8 (``kind``'s layout, with a static input scale that must be
    ignored) and, beside it, a float32 checkpoint of the weights the FP8 one means."""
    fp8_dir, float_dir = folder / f"fp8-{kind}", folder / f"float-{kind}"
    tensors = load_file(source / "model.safetensors")
    stored, widened = {}, {}
    for name, tensor in tensors.items():
        if name.endswith(".weight") and any(p in name for p in PROJECTIONS):
            codes, scale, meant = to_fp8(tensor.float(), kind)
            prefix = name.removesuffix(".weight")
            stored[name] = codes
            stored[prefix + (".weight_scale" if kind == "channel" else ".weight_scale_inv")] = scale
            stored[prefix + ".input_scale"] = torch.tensor([0.5])
            widened[name] = meant
        else:
            stored[name] = widened[name] = tensor
    config = json.loads((source / "config.json").read_text())
    for target, weights, extra in (
        (
            fp8_dir,
            stored,
            {"quantization_config": CHANNEL_CONFIG if kind == "channel" else BLOCK_CONFIG},
        ),
        (float_dir, widened, {}),
    ):
        target.mkdir()
        save_file(weights, target / "model.safetensors")
        (target / "config.json").write_text(json.dumps({**config, **extra}))
    return fp8_dir, float_dir


@pytest.mark.parametrize("kind", ["channel", "block"])
def test_an_fp8_checkpoint_loads_with_the_logits_of_the_weights_it_means(
    kind, tiny_model, tmp_path
):
    source, _ = tiny_model("qwen3")
    fp8_dir, float_dir = write_fp8_pair(source, tmp_path, kind)
    assert fp8_checkpoint_format(fp8_dir) == (
        Fp8Checkpoint("channel") if kind == "channel" else Fp8Checkpoint("block", BLOCK)
    )
    assert fp8_checkpoint_format(float_dir) is None
    seqs = [[3, 17, 42, 99, 5, 250, 8], [7, 7, 300, 12]]
    logits = {}
    for name, folder in (("fp8", fp8_dir), ("float", float_dir)):
        llm = LLM(str(folder), device="cpu", dtype="float32")
        assert llm.engine.quantization == "none"  # on a CPU: widened, no FP8 kernels
        logits[name] = llm.score_batch(seqs)
    for ours, want in zip(logits["fp8"], logits["float"]):
        torch.testing.assert_close(ours, want, rtol=0, atol=0)
    # and the FP8 rounding is real: the widened weights differ from the original ones
    original = load_file(source / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    meant = load_file(float_dir / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert 0 < (original - meant).abs().max() < 0.1 * original.abs().max()


def test_an_fp8_weight_without_its_scale_is_a_clear_error(tiny_model, tmp_path):
    source, _ = tiny_model("qwen3")
    fp8_dir, _ = write_fp8_pair(source, tmp_path, "channel")
    tensors = load_file(fp8_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, fp8_dir / "model.safetensors")
    with pytest.raises(WeightsError, match=r"down_proj\.weight.*FP8 without its scale"):
        LLM(str(fp8_dir), device="cpu", dtype="float32")


def test_block_scales_that_do_not_tile_the_matrix_are_a_clear_error(tiny_model, tmp_path):
    source, _ = tiny_model("qwen3")
    fp8_dir, _ = write_fp8_pair(source, tmp_path, "block")
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [16, 16]  # the stored scales are 48s
    (fp8_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="do not tile"):
        LLM(str(fp8_dir), device="cpu", dtype="float32")
    shutil.rmtree(fp8_dir)


@pytest.mark.parametrize(
    "shape, block", [((64, 128), (48, 48)), ((96, 128), (32, 64)), ((7, 5), (4, 2))]
)
def test_block_scales_widen_each_block_exactly_as_a_full_size_scale_matrix_would(shape, block):
    """widen_fp8 scales block by block (a view of the weight, the scale broadcast): the same
    float32 products as multiplying by a full-size scale matrix, ragged last blocks included."""
    from minisgl_engine.weights.fp8_checkpoint import widen_fp8

    gen = torch.Generator().manual_seed(0)
    codes = (torch.randn(shape, generator=gen) * 100).to(FP8)
    blocks = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    scale = torch.rand(blocks, generator=gen) + 0.01
    full = scale.repeat_interleave(block[0], 0)[: shape[0]].repeat_interleave(block[1], 1)
    want = codes.float() * full[:, : shape[1]]
    stored = codes.clone()
    torch.testing.assert_close(widen_fp8(codes, scale, block), want, rtol=0, atol=0)
    if shape[0] % block[0] == 0 and shape[1] % block[1] == 0:  # the block read off the scales
        torch.testing.assert_close(widen_fp8(codes, scale), want, rtol=0, atol=0)
    assert torch.equal(codes.view(torch.uint8), stored.view(torch.uint8))  # the input is kept


def test_a_per_channel_checkpoint_is_held_as_stored_where_the_engine_holds_fp8(
    tiny_model, tmp_path, monkeypatch
):
    """Where the engine holds projections in FP8 (a GPU's --quantization fp8, forced here on the
    CPU, its products on the widened weight rather than FP8 activations), a per-channel
    checkpoint's codes and row scales are installed as stored, merged parts stacked by rows: no
    widening and rounding again. The logits are the float checkpoint's within float32 rounding
    (another CPU product)."""
    from minisgl_engine import model_loader
    from minisgl_engine.layers import fp8

    source, _ = tiny_model("qwen3")
    fp8_dir, float_dir = write_fp8_pair(source, tmp_path, "channel")
    monkeypatch.setattr(model_loader, "choose_quantization", lambda *args, **kwargs: "fp8")
    monkeypatch.setattr(fp8, "scaled_mm_works", lambda device: False)
    llm = LLM(str(fp8_dir), device="cpu", dtype="float32")
    assert llm.engine.quantization == "fp8"
    stored = load_file(fp8_dir / "model.safetensors")
    layer = llm.engine.model.model.layers[1]
    for module, parts in (
        (layer.self_attn.qkv_proj, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
        (layer.mlp.gate_up_proj, ("mlp.gate_proj", "mlp.up_proj")),
        (layer.mlp.down_proj, ("mlp.down_proj",)),
    ):
        codes = torch.cat([stored[f"model.layers.1.{p}.weight"] for p in parts])
        scales = torch.cat([stored[f"model.layers.1.{p}.weight_scale"].reshape(-1) for p in parts])
        assert module.weight.dtype == FP8
        assert torch.equal(module.weight.view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(module.weight_scale, scales.float())
    seqs = [[3, 17, 42, 99, 5, 250, 8], [7, 7, 300, 12]]
    ours = llm.score_batch(seqs)
    del llm
    monkeypatch.undo()
    plain = LLM(str(float_dir), device="cpu", dtype="float32")
    for got, want in zip(ours, plain.score_batch(seqs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
