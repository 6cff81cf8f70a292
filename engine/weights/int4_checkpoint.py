"""AWQ and GPTQ checkpoints' 4-bit matrices unpacked into plain codes, zero points and scales
(:class:`Int4Weight`), which the model holds as group codes (layers/quantized.py's
``int4_checkpoint_planes``) or widens. Which checkpoints these are: weights/int4_config.py.

Both store ``weight = (code - zero) * scale`` per group of inputs, in int32 words of eight 4-bit
values, but pack them differently (checked against the reference packers by
scripts/int4_reference_fixtures.py and tests/unit/test_int4_checkpoint.py):

- AWQ "gemm": ``qweight`` [in, out / 8] packs eight output columns per word in the interleaved
  order (0, 2, 4, 6, 1, 3, 5, 7); ``qzeros`` [in / group, out / 8] the same way; ``scales``
  [in / group, out] float16.
- GPTQ: ``qweight`` [in / 8, out] packs eight consecutive inputs per word (nibble j = input
  8 * row + j); ``qzeros`` [in / group, out / 8] eight consecutive columns per word; ``scales``
  [in / group, out]; ``g_idx`` [in] each input's group. The historical format stored every zero
  point minus one by subtracting 0x11111111 from each word (GPTQModel's export; a zero of 0
  borrows from the next one), so adding it back word by word gives the zero points meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..errors import WeightsError
from .int4_config import Int4Checkpoint
from .safetensors_io import LazySlice, read_tensor

# nibble i of an AWQ word holds column 8 * word + AWQ_ORDER[i]; column k is in nibble
# AWQ_REVERSE[k]
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)
PARTS = ("qweight", "qzeros", "scales", "g_idx")


@dataclass
class Int4Weight:
    """One [out, in] matrix: ``codes`` [out, in] uint8 in [0, 15]; ``zeros`` [out, groups]
    int16, the zero point of each group (a historical GPTQ file's may be 16); ``scales``
    [out, groups] float16. ``weight = (code - zero) * scale``, exact in float32."""

    codes: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scales.shape[1]

    def to(self, device: torch.device) -> Int4Weight:
        return Int4Weight(self.codes.to(device), self.zeros.to(device), self.scales.to(device))

    def centered(self) -> torch.Tensor:
        """``code - zero`` of every weight, int16 [out, in]."""
        return self.codes.to(torch.int16) - self.zeros.repeat_interleave(self.group_size, dim=1)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight (exact: a small integer times a float16 scale)."""
        scales = self.scales.float().repeat_interleave(self.group_size, dim=1)
        return self.centered().float() * scales


def nibbles(words: torch.Tensor) -> torch.Tensor:
    """The eight 4-bit values of each int32 word, lowest first: [..., n] -> [..., n, 8] uint8."""
    if words.dtype != torch.int64:
        words = words.to(torch.int32)
    shifts = torch.arange(0, 32, 4, dtype=words.dtype, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 15).to(torch.uint8)


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    """An AWQ tensor's [rows, out / 8] words as [rows, out] values in column order."""
    values = nibbles(words)[..., list(AWQ_REVERSE)]
    return values.reshape(words.shape[0], -1)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Int4Weight:
    """An AWQ "gemm" matrix as codes, zero points and scales, in our [out, in] orientation."""
    codes = _awq_columns(qweight).t().contiguous()
    zeros = _awq_columns(qzeros).t().to(torch.int16).contiguous()
    return _checked(Int4Weight(codes, zeros, scales.t().to(torch.float16).contiguous()))


def unpack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    zero_offset: int,
) -> Int4Weight:
    """A GPTQ matrix as codes, zero points and scales, in our [out, in] orientation; a
    WeightsError where ``g_idx`` is not groups of consecutive inputs (act-order)."""
    codes = nibbles(qweight.t()).reshape(qweight.shape[1], -1).contiguous()
    words = qzeros.to(torch.int64)
    if zero_offset:  # each nibble plus one, carried across the word as it was borrowed
        words = (words + 0x11111111 * zero_offset) & 0xFFFFFFFF
    zeros = nibbles(words).reshape(qzeros.shape[0], -1).t().to(torch.int16).contiguous()
    weight = _checked(Int4Weight(codes, zeros, scales.t().to(torch.float16).contiguous()))
    if g_idx is not None:
        groups = torch.arange(codes.shape[1], device=g_idx.device) // weight.group_size
        if not torch.equal(g_idx.to(torch.int64), groups):
            raise ValueError(
                "its g_idx does not put consecutive inputs in each group (act-order, desc_act), "
                "which our 4-bit kernels cannot hold"
            )
    return weight


def _checked(weight: Int4Weight) -> Int4Weight:
    out, cols = weight.codes.shape
    groups = weight.scales.shape[1]
    if weight.scales.shape[0] != out or weight.zeros.shape != weight.scales.shape:
        raise ValueError(
            f"codes {tuple(weight.codes.shape)}, zero points {tuple(weight.zeros.shape)} and "
            f"scales {tuple(weight.scales.shape)} do not agree"
        )
    if groups == 0 or cols % groups or (cols // groups) % 32:
        raise ValueError(f"{groups} groups do not split {cols} inputs into multiples of 32")
    return weight


def read_int4_checkpoint(
    weights: Iterable[tuple[str, torch.Tensor | LazySlice]], layout: Int4Checkpoint
) -> Iterator[tuple[str, torch.Tensor | LazySlice | Int4Weight]]:
    """The checkpoint's tensors with each quantized matrix's parts (``X.qweight``,
    ``X.qzeros``, ``X.scales``, GPTQ's ``X.g_idx``; a shard may list them apart) joined into
    one ``X.weight`` :class:`Int4Weight`. Other tensors pass through as they come."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}  # module name -> its parts read so far
    needed = set(PARTS) if layout.method == "gptq" else set(PARTS[:3])
    for name, tensor in weights:
        module, _, part = name.rpartition(".")
        if part not in PARTS:
            yield name, tensor
            continue
        parts = waiting.setdefault(module, {})
        parts[part] = read_tensor(tensor)
        if needed <= parts.keys():
            yield f"{module}.weight", _joined(module, waiting.pop(module), layout)
    for module, parts in waiting.items():  # a GPTQ export without g_idx is whole without it
        if not set(PARTS[:3]) <= parts.keys():
            missing = sorted(set(PARTS[:3]) - parts.keys())[0]
            raise WeightsError(f"checkpoint tensor {module}.{missing} is missing")
        yield f"{module}.weight", _joined(module, parts, layout)


def _joined(module: str, parts: dict[str, torch.Tensor], layout: Int4Checkpoint) -> Int4Weight:
    try:
        if layout.method == "awq":
            return unpack_awq(parts["qweight"], parts["qzeros"], parts["scales"])
        return unpack_gptq(
            parts["qweight"],
            parts["qzeros"],
            parts["scales"],
            parts.get("g_idx"),
            layout.zero_offset,
        )
    except (ValueError, RuntimeError) as exc:
        raise WeightsError(f"checkpoint tensor {module}.qweight: {exc}") from None
