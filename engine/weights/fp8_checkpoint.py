"""Checkpoints stored in FP8 (e4m3) in the two Hugging Face layouts people download:

- **per channel or per tensor** (llm-compressor's "compressed-tensors", e.g. the ``-FP8-dynamic``
  uploads): ``X.weight`` in FP8 beside ``X.weight_scale`` (one float per output row, or one for
  the matrix); the weight is ``weight * weight_scale``.
- **per block** (transformers' ``quant_method: fp8`` with ``weight_block_size``, e.g. Qwen's own
  ``-FP8`` uploads): ``X.weight_scale_inv`` holds one float per ``[128, 128]`` block; the weight
  is ``weight * weight_scale_inv`` block by block.

A per-channel checkpoint's matrices are already our FP8 form (layers/fp8.py: e4m3 codes with one
float32 scale per output row), so where the engine holds projections in FP8 (``--quantization
fp8`` on a GPU, chosen by ``auto`` for such a checkpoint) they are passed on as stored
(:class:`Fp8Weight`) and installed without a round trip. A per-block checkpoint's scale changes
every 128 inputs along a row, which one scale per row cannot express: its codes are widened here
with their scales (exactly: an e4m3 value times a float32 scale is a float32 product) and, on a
GPU, rounded once more to per-row scales. On a CPU every FP8 matrix is widened, and the rest of
the loader sees a float checkpoint. Activation scales stored for a static scheme
(``input_scale``) are not used: activations are scaled per token as they come.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import WeightsError
from .int4_config import read_quantization_config
from .safetensors_io import LazySlice, read_tensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")


@dataclass(frozen=True)
class Fp8Checkpoint:
    """How a checkpoint stores its FP8 weights: ``kind`` "channel" (a scale per output row, or
    one per matrix) or "block" (a scale per ``block`` = [rows, columns] of weights)."""

    kind: str
    block: tuple[int, int] | None = None


@dataclass
class Fp8Weight:
    """One FP8 matrix of a per-channel checkpoint held as stored: e4m3 ``codes`` [out, in] and
    a float32 ``scale`` per output row [out], the form ``--quantization fp8`` holds."""

    codes: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (where the engine does not hold this matrix in FP8)."""
        return widen_fp8(self.codes, self.scale)


def fp8_checkpoint_format(model_dir: Path | None) -> Fp8Checkpoint | None:
    """The FP8 layout of a checkpoint whose config.json says its weights are stored in FP8;
    None for any other."""
    quant = read_quantization_config(Path(model_dir)) if model_dir is not None else None
    if quant is None:
        return None
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size")
        return Fp8Checkpoint("block", tuple(block)) if block else Fp8Checkpoint("channel")
    if method == "compressed-tensors" and quant.get("format") in (
        "float-quantized",
        "naive-quantized",
    ):
        for group in (quant.get("config_groups") or {}).values():
            weights = (group.get("weights") or {}) if isinstance(group, dict) else {}
            if weights.get("type") == "float" and weights.get("num_bits") == 8:
                if weights.get("strategy") == "block":
                    block = weights.get("block_structure")
                    return Fp8Checkpoint("block", tuple(block) if block else None)
                return Fp8Checkpoint("channel")
    return None


def widen_fp8(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None
) -> torch.Tensor:
    """The float32 weight of an FP8 matrix [out, in] and its scale: one value, one per row
    ([out] or [out, 1]), or one per ``block`` of weights ([ceil(out / b0), ceil(in / b1)]; without
    ``block``, the smallest block that the scales tile the matrix with)."""
    wide = weight.to(torch.float32, copy=True)  # scaled in place below
    scale = scale.float()
    if scale.numel() == 1:
        return wide * scale.reshape(())
    if scale.dim() == 1 or (scale.dim() == 2 and scale.shape[1] == 1):
        if scale.shape[0] != wide.shape[0]:
            raise ValueError(f"{scale.shape[0]} row scales for {wide.shape[0]} rows")
        return wide * scale.reshape(-1, 1)
    rows, cols = wide.shape
    blocks_r, blocks_c = scale.shape
    block_r, block_c = block or (-(-rows // blocks_r), -(-cols // blocks_c))
    if -(-rows // block_r) != blocks_r or -(-cols // block_c) != blocks_c:
        raise ValueError(f"block scales {tuple(scale.shape)} do not tile a {rows}x{cols} matrix")
    # block by block, in place: the whole blocks of each region (the last row and column of
    # blocks may be ragged) viewed as [blocks down, rows, blocks across, columns], times the
    # broadcast scale; no full-size scale matrix
    whole_r, whole_c = rows - rows % block_r, cols - cols % block_c
    for r0, r1, height in ((0, whole_r, block_r), (whole_r, rows, rows - whole_r)):
        for c0, c1, width in ((0, whole_c, block_c), (whole_c, cols, cols - whole_c)):
            if r1 > r0 and c1 > c0:
                part = scale[r0 // block_r : -(-r1 // block_r), c0 // block_c : -(-c1 // block_c)]
                wide[r0:r1, c0:c1].view(part.shape[0], height, part.shape[1], width).mul_(
                    part[:, None, :, None]
                )
    return wide


def read_fp8_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor | LazySlice]],
    layout: Fp8Checkpoint,
    keep_channel_codes: bool = False,
) -> Iterator[tuple[str, torch.Tensor | LazySlice | Fp8Weight]]:
    """The checkpoint's tensors with every FP8 weight joined to its scale (a weight waits for
    its scale, which a shard may list after it): widened, or with ``keep_channel_codes`` a
    per-channel e4m3 weight as an :class:`Fp8Weight`. Scales and stored activation scales are
    consumed; other tensors pass through as they come."""
    waiting: dict[str, torch.Tensor] = {}  # weight name -> the FP8 weight without its scale yet
    scales: dict[str, torch.Tensor] = {}  # weight name -> a scale read before its weight
    for name, tensor in weights:
        if name.endswith(".input_scale"):
            continue
        suffix = next((s for s in SCALE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            weight_name = name.removesuffix(suffix) + ".weight"
            scale = read_tensor(tensor)
            if weight_name in waiting:
                yield (
                    weight_name,
                    _joined(
                        weight_name, waiting.pop(weight_name), scale, layout, keep_channel_codes
                    ),
                )
            else:
                scales[weight_name] = scale
            continue
        if (isinstance(tensor, torch.Tensor) and tensor.dtype in FP8_DTYPES) or (
            isinstance(tensor, LazySlice) and _is_fp8(tensor)
        ):
            weight = read_tensor(tensor)
            if name in scales:
                yield name, _joined(name, weight, scales.pop(name), layout, keep_channel_codes)
            else:
                waiting[name] = weight
            continue
        yield name, tensor
    if waiting:
        raise WeightsError(
            f"checkpoint tensor {next(iter(waiting))!r} is stored in FP8 without its scale "
            "(weight_scale or weight_scale_inv)"
        )


def _is_fp8(tensor: LazySlice) -> bool:
    return tensor.dtype_name in ("F8_E4M3", "F8_E5M2")


def _joined(
    name: str, weight: torch.Tensor, scale: torch.Tensor, layout: Fp8Checkpoint, keep: bool
) -> torch.Tensor | Fp8Weight:
    """The weight widened by its scale, or kept as stored where it is our FP8 form."""
    if keep and layout.kind == "channel" and weight.dtype == torch.float8_e4m3fn:
        rows = weight.shape[0]
        if scale.numel() in (1, rows):
            return Fp8Weight(weight, scale.float().reshape(-1).expand(rows).contiguous())
    try:
        return widen_fp8(weight, scale, layout.block)
    except ValueError as exc:
        raise WeightsError(f"checkpoint tensor {name!r}: {exc}") from None
