"""AWQ and GPTQ checkpoints of tiny models for the tests, written by our own packer (the inverse
of weights/int4_checkpoint.py's unpacking). tests/unit/test_int4_checkpoint.py checks that this
packer writes the very words the reference packers wrote (tests/data/int4_reference.safetensors,
made by scripts/int4_reference_fixtures.py), so checkpoints made here stand for real exports."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from minisgl_engine.weights.int4_checkpoint import AWQ_ORDER, Int4Weight

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def _words(values: torch.Tensor) -> torch.Tensor:
    """[..., 8] 4-bit values, lowest nibble first, as int32 words [...] (two's complement)."""
    words = (values.to(torch.int64) << SHIFTS).sum(dim=-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def pack_awq(weight: Int4Weight) -> dict[str, torch.Tensor]:
    """AutoAWQ's "gemm" tensors of a matrix: eight output columns per word, interleaved."""
    codes, zeros = weight.codes.t(), weight.zeros.t()  # [in, out], [groups, out]
    order = list(AWQ_ORDER)
    return {
        "qweight": _words(codes.reshape(codes.shape[0], -1, 8)[..., order]),
        "qzeros": _words(zeros.reshape(zeros.shape[0], -1, 8)[..., order]),
        "scales": weight.scales.t().contiguous(),
    }


def pack_gptq(weight: Int4Weight, historical: bool = True) -> dict[str, torch.Tensor]:
    """GPTQ's tensors of a matrix: eight inputs per ``qweight`` word, eight columns per
    ``qzeros`` word; ``historical``: each zero word minus 0x11111111, as GPTQModel exports the
    "gptq" format (AutoGPTQ subtracts one per nibble: the same words for zero points >= 1)."""
    codes, zeros = weight.codes.t(), weight.zeros.t()  # [in, out], [groups, out]
    qweight = _words(codes.reshape(-1, 8, codes.shape[1]).transpose(1, 2))
    zero_words = _words(zeros.reshape(zeros.shape[0], -1, 8))
    if historical:
        zero_words = _words_minus(zero_words, 0x11111111)
    groups = torch.arange(codes.shape[0], dtype=torch.int32) // weight.group_size
    return {
        "qweight": qweight,
        "qzeros": zero_words,
        "scales": weight.scales.t().contiguous(),
        "g_idx": groups,
    }


def _words_minus(words: torch.Tensor, value: int) -> torch.Tensor:
    wide = (words.to(torch.int64) - value) % (1 << 32)
    return torch.where(wide >= 1 << 31, wide - (1 << 32), wide).to(torch.int32)


def quantize_rtn(weight: torch.Tensor, group: int, symmetric: bool) -> Int4Weight:
    """Round-to-nearest 4-bit codes of a float [out, in] matrix, per group of ``group`` inputs:
    symmetric (zero point 8, as GPTQ's sym) or with each group's own zero point (as AWQ)."""
    out, cols = weight.shape
    size = cols if group == -1 else group
    groups = weight.float().reshape(out, cols // size, size)
    if symmetric:
        scales = (groups.abs().amax(dim=-1) * 2 / 15).clamp(min=1e-5).half()
        zeros = torch.full_like(scales, 8, dtype=torch.int16)
    else:
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = ((high - low) / 15).clamp(min=1e-5).half()
        zeros = torch.round(-low / scales.float()).clamp(0, 15).to(torch.int16)
    codes = torch.round(groups / scales.float()[..., None]) + zeros[..., None]
    return Int4Weight(codes.clamp(0, 15).to(torch.uint8).reshape(out, cols), zeros, scales)


def quantization_config(method: str, group: int, symmetric: bool, fmt: str) -> dict:
    if method == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": True,
            "version": fmt,
            "modules_to_not_convert": None,
        }
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group,
        "desc_act": False,
        "sym": symmetric,
        "checkpoint_format": fmt,
        "true_sequential": True,
        "damp_percent": 0.01,
    }


def make_wide_tiny_model(folder: Path, seed: int = 0) -> Path:
    """A tiny random float32 Qwen3 whose projections take 128 or 256 inputs (groups of 128
    need as many): the tiny_models one, twice as wide."""
    from tiny_models import TINY
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        **{**TINY, "hidden_size": 128, "intermediate_size": 256, "num_key_value_heads": 2},
        head_dim=32,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.1) if "norm" in name else p.normal_(0, 0.08)
    model.save_pretrained(folder)
    return folder


def write_int4_pair(
    source: Path, folder: Path, method: str, group: int, symmetric: bool, fmt: str
) -> tuple[Path, Path]:
    """``source``'s decoder projections as an AWQ/GPTQ checkpoint, and beside it a float32
    checkpoint of the weights that one means (its exact dequantization)."""
    from safetensors.torch import load_file, save_file

    name = f"{method}-{fmt}-g{group}-{'sym' if symmetric else 'asym'}"
    quant_dir, float_dir = folder / name, folder / f"{name}-float"
    stored, meant = {}, {}
    for key, tensor in load_file(source / "model.safetensors").items():
        if key.endswith(".weight") and any(p in key for p in PROJECTIONS):
            weight = quantize_rtn(tensor, group, symmetric)
            parts = pack_awq(weight) if method == "awq" else pack_gptq(weight, fmt == "gptq")
            prefix = key.removesuffix(".weight")
            stored.update({f"{prefix}.{part}": value for part, value in parts.items()})
            meant[key] = weight.dequantize()
        else:
            stored[key] = meant[key] = tensor
    config = json.loads((source / "config.json").read_text())
    for target, tensors, extra in (
        (
            quant_dir,
            stored,
            {"quantization_config": quantization_config(method, group, symmetric, fmt)},
        ),
        (float_dir, meant, {}),
    ):
        target.mkdir()
        save_file(tensors, target / "model.safetensors")
        (target / "config.json").write_text(json.dumps({**config, **extra}))
    return quant_dir, float_dir
