"""Quantized weights: GGUF blocks written once as "planes" of 4-bit codes, then stored for our C
kernels (``NativeWeight``, cpu_kernels.c) or, without a C compiler, for torch's packed 4-bit
kernel (``PackedWeight``); on a GPU, in the C kernels' layout (``GroupCodes``) for the Triton
kernels (quantized_gpu.py).

A plane is ``code * scale + offset`` per group of 32 inputs with a 4-bit code. Every GGUF type we
keep is written as one or two planes over the same groups:

- Q4_0, Q4_1, Q4_K: one plane (the 4-bit codes as they are; the block's scale and minimum);
- Q5_0, Q5_1, Q5_K, Q8_0: two planes, the low four bits and the high bits of each code (the high
  plane's scale is 16 times the low one's), both exact;
- types whose scales cover 16 weights (Q6_K, Q3_K, Q2_K), and any other type: dequantized once
  and re-quantized to 8 bits in groups of 32 (two planes); the added error is at most half an
  8-bit step, a fraction of the type's own step.

``NativeWeight`` keeps one plane as 4-bit codes and two as 8-bit codes (``low + 16 * high``),
with float16 scales and offsets: the file's own values for the 32-weight types, exactly.
``PackedWeight`` (torch's ``_weight_int4pack_mm_for_cpu``, bf16 scales and activations) puts
the planes side by side along the input dimension: one kernel call on the input repeated once
per plane.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..weights.gguf_tensors import dequantize_gguf
from ..weights.int4_checkpoint import Int4Weight

GROUP = 32  # inputs per scale in the packed kernel
_ROW_MULTIPLE = 16  # the packing wants the output dimension in multiples of 16
# NativeWeight: up to this many rows the C kernel's integer dots; above, the BLAS on the weight
# widened block by block (at most this many floats at a time)
INTEGER_DOT_MAX_ROWS = 24
WIDENED_BLOCK_FLOATS = 4 << 20

# GGML type ids (gguf.GGMLQuantizationType) with an exact plane form
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q4_K, Q5_K = 12, 13
# (block bytes, weights per block) of the types decoded here
_BLOCKS = {
    Q4_0: (18, 32),
    Q4_1: (20, 32),
    Q5_0: (22, 32),
    Q5_1: (24, 32),
    Q8_0: (34, 32),
    Q4_K: (144, 256),
    Q5_K: (176, 256),
}


def packed_kernels_available() -> bool:
    """torch builds with the CPU 4-bit kernel (x86 and Arm builds of torch >= 2.5)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


@dataclass
class Planes:
    """``weight = sum_p codes[p] * scales[p] (per group of 32) + offset (per group)``.

    codes: [P, rows, in] uint8 in [0, 15]; scales: [P, rows, in / 32] float32;
    offset: [rows, in / 32] float32."""

    codes: torch.Tensor
    scales: torch.Tensor
    offset: torch.Tensor

    @property
    def num_planes(self) -> int:
        return self.codes.shape[0]

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these planes stand for (tests and the reference path)."""
        per_weight = lambda t: t.repeat_interleave(GROUP, dim=-1)  # noqa: E731
        w = per_weight(self.offset)
        for p in range(self.num_planes):
            w = w + self.codes[p].float() * per_weight(self.scales[p])
        return w

    def with_planes(self, num_planes: int) -> Planes:
        """The same weight with zero planes appended (parts of one merged matrix must agree)."""
        extra = num_planes - self.num_planes
        if extra <= 0:
            return self
        codes = torch.cat((self.codes, self.codes.new_zeros((extra, *self.codes.shape[1:]))))
        scales = torch.cat((self.scales, self.scales.new_zeros((extra, *self.scales.shape[1:]))))
        return Planes(codes, scales, self.offset)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 stored at byte ``start`` of every block, as float32: [rows, blocks]."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return qs & 15, qs >> 4


def _bits(qh: torch.Tensor, count: int) -> torch.Tensor:
    """Bits of ``qh`` [..., bytes] little-endian: [..., count, bytes] (bit b of every byte)."""
    shifts = torch.arange(count, dtype=torch.uint8, device=qh.device).view(
        *([1] * (qh.dim() - 1)), count, 1
    )
    return (qh.unsqueeze(-2) >> shifts) & 1


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 6-bit scales and minimums of the eight 32-weight sub-blocks of a Q4_K/Q5_K block
    ([..., 12] bytes -> two [..., 8]), unpacked by the gguf package."""
    from gguf.quants import Q4_K as Q4_K_BLOCKS

    sc, mins = Q4_K_BLOCKS.get_scale_min(scales.reshape(-1, 12).cpu().numpy())
    shape = (*scales.shape[:-1], 8)
    return tuple(
        torch.from_numpy(t).reshape(shape).to(scales.device, torch.float32) for t in (sc, mins)
    )


def _group_planes(
    low: torch.Tensor,
    high: torch.Tensor | None,
    scale: torch.Tensor,
    offset: torch.Tensor,
    rows: int,
) -> Planes:
    """Planes from codes shaped [rows, groups, 32] and per-group scale/offset [rows, groups]."""
    codes = [low.reshape(rows, -1)]
    scales = [scale.reshape(rows, -1)]
    if high is not None:
        codes.append(high.reshape(rows, -1))
        scales.append(16 * scale.reshape(rows, -1))
    return Planes(torch.stack(codes), torch.stack(scales), offset.reshape(rows, -1))


def gguf_planes(raw: torch.Tensor, qtype: int, in_features: int) -> Planes | None:
    """Decode GGUF blocks ``raw`` ([rows, bytes per row], uint8) into planes, exactly;
    None for a type without an exact plane form (see ``int8_planes``)."""
    if qtype not in _BLOCKS:
        return None
    block_bytes, per_block = _BLOCKS[qtype]
    rows = raw.shape[0]
    blocks = raw.reshape(rows, in_features // per_block, block_bytes)
    if per_block == 32:
        d = _f16(blocks, 0)
        if qtype == Q8_0:
            unsigned = blocks[..., 2:] ^ 0x80  # int8 + 128
            low, high = _nibbles(unsigned)
            return _group_planes(low, high, d, -128 * d, rows)
        has_min = qtype in (Q4_1, Q5_1)
        start = 4 if has_min else 2
        offset = _f16(blocks, 2) if has_min else None
        high = None
        if qtype in (Q5_0, Q5_1):
            high = _bits(blocks[..., start : start + 4], 8).transpose(-1, -2).reshape(rows, -1, 32)
            start += 4
        low = torch.cat(
            _nibbles(blocks[..., start : start + 16]), dim=-1
        )  # weights 0-15, then 16-31
        if offset is None:
            offset = -(16 if high is not None else 8) * d
        return _group_planes(low, high, d, offset, rows)
    # K-quants: 256 weights in eight sub-blocks of 32, each with a 6-bit scale and minimum
    d, dmin = _f16(blocks, 0)[..., None], _f16(blocks, 2)[..., None]
    sc, mins = _k_scales(blocks[..., 4:16])
    qs_start = 16 if qtype == Q4_K else 48
    qs = blocks[..., qs_start : qs_start + 128].reshape(rows, -1, 4, 32)
    low = torch.stack(_nibbles(qs), dim=-2).reshape(
        rows, -1, 8, 32
    )  # sub-block 2i, 2i+1 from byte run i
    high = _bits(blocks[..., 16:48], 8) if qtype == Q5_K else None  # bit j: sub-block j
    return _group_planes(low, high, d * sc, -dmin * mins, rows)


def float16_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest float16 value >= x, as float32: quantization scales the C kernels store
    exactly (rounded up, so no code leaves its range)."""
    h = x.half()
    return torch.where(h.float() < x, torch.nextafter(h, torch.full_like(h, torch.inf)), h).float()


def float16_at_most(x: torch.Tensor) -> torch.Tensor:
    """The largest float16 value <= x, as float32."""
    return -float16_at_least(-x)


def int8_planes(weight: torch.Tensor) -> Planes:
    """Symmetric 8-bit codes per group of 32 (scale = max |w| / 127), as two 4-bit planes."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // GROUP, GROUP)
    scale = float16_at_least(groups.abs().amax(dim=-1) / 127)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / safe[..., None]).clamp(-127, 127).to(torch.int16) + 128
    low, high = (q & 15).to(torch.uint8), (q >> 4).to(torch.uint8)
    return _group_planes(low, high, scale, -128 * scale, rows)


def int4_planes(weight: torch.Tensor) -> Planes:
    """Asymmetric 4-bit codes per group of 32 (the group's minimum and range / 15), one plane."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // GROUP, GROUP)
    low = float16_at_most(groups.amin(dim=-1))
    scale = float16_at_least((groups.amax(dim=-1) - low) / 15)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.uint8)
    return _group_planes(codes, None, scale, low, rows)


class PackedWeight:
    """A [out, in] weight in the packed 4-bit layout; ``matmul(x)`` is ``x @ weight.T``."""

    def __init__(self, planes: Planes) -> None:
        num_planes, rows, cols = planes.codes.shape
        if cols % GROUP:
            raise ValueError(f"input features {cols} are not a multiple of {GROUP}")
        self.out_features, self.in_features, self.num_planes = rows, cols, num_planes
        padded = -(-rows // _ROW_MULTIPLE) * _ROW_MULTIPLE
        # The kernel subtracts 8 from every code. A plane of small codes (the high bit of a
        # 5-bit code) is stored as code + 8, so its terms stay as small as they are; the constant
        # left over goes to plane 0's zero. Scales and zeros are rounded to bf16: no two large
        # terms may cancel after that rounding.
        shifted = [bool(planes.codes[p].max() <= 7) for p in range(num_planes)]
        codes = torch.stack([c + 8 if s else c for c, s in zip(planes.codes, shifted)])
        codes = codes.permute(1, 0, 2).reshape(rows, num_planes * cols)  # planes side by side
        zeros = torch.zeros_like(planes.scales)
        zeros[0] = planes.offset + 8 * sum(
            planes.scales[p] for p in range(num_planes) if not shifted[p]
        )
        sz = torch.stack((planes.scales, zeros), dim=-1)  # [P, rows, groups, 2]
        sz = sz.permute(0, 2, 1, 3).reshape(num_planes * cols // GROUP, rows, 2)
        if padded != rows:
            codes = torch.cat((codes, codes.new_zeros((padded - rows, codes.shape[1]))))
            sz = torch.cat((sz, sz.new_zeros((sz.shape[0], padded - rows, 2))), dim=1)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        self.scales_and_zeros = sz.to(torch.bfloat16).contiguous()

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_and_zeros.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul_bf16(x.to(torch.bfloat16)).to(x.dtype)

    def matmul_bf16(self, xb: torch.Tensor) -> torch.Tensor:
        """The product of a bf16 input, in bf16 (the kernel's own types)."""
        if xb.shape[0] == 0:  # a step whose rows all skip this product (no request samples)
            return xb.new_empty((0, self.out_features))
        if self.num_planes > 1:
            xb = xb.repeat(1, self.num_planes)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            xb, self.packed, GROUP, self.scales_and_zeros
        )
        return out if out.shape[1] == self.out_features else out[:, : self.out_features]


@dataclass
class GroupCodes:
    """Planes in the layout both our C kernels (cpu_kernels.c's ``QWeight``) and the GPU's
    Triton kernels (kernels/triton_quant.py) read: ``kind`` 4, one plane as 4-bit codes, two
    per byte (byte ``j`` of each 64-input block holds input ``j`` in its low nibble and input
    ``32 + j`` in its high one); ``kind`` 8, two planes as 8-bit codes (``low + 16 * high``).
    ``scales``: [rows, in / 32, 2] float16 (each group's scale and offset) times ``1 / mult``,
    a power of two that keeps the largest near 2^14 (float16's range ends at 65504)."""

    kind: int
    codes: torch.Tensor
    scales: torch.Tensor
    mult: float

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def to(self, device: torch.device) -> GroupCodes:
        return GroupCodes(self.kind, self.codes.to(device), self.scales.to(device), self.mult)


def group_codes(planes: Planes) -> GroupCodes:
    """One or two planes (of a multiple of 64 inputs) in the :class:`GroupCodes` layout."""
    num_planes, rows, cols = planes.codes.shape
    if cols % (2 * GROUP) or num_planes > 2:
        raise ValueError(f"the group kernels take 1-2 planes of a multiple of {2 * GROUP} inputs")
    groups = planes.codes.reshape(num_planes, rows, cols // GROUP, GROUP)
    if num_planes == 1:
        kind = 4
        pairs = groups[0].reshape(rows, cols // (2 * GROUP), 2, GROUP)
        codes = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(rows, cols // 2).contiguous()
    else:
        # the high plane must weigh 16 low steps wherever it has codes (a zero plane added by
        # stack_rows has scale 0 and no codes)
        high_used = groups[1].amax(dim=-1) > 0
        if not bool(torch.where(high_used, planes.scales[1] == 16 * planes.scales[0], True).all()):
            raise ValueError("planes whose high plane is not 16 low steps")
        kind = 8
        codes = (planes.codes[0] + (planes.codes[1] << 4)).contiguous()
    scales, mult = float16_scales(torch.stack((planes.scales[0], planes.offset), dim=-1))
    return GroupCodes(kind, codes, scales, mult)


def float16_scales(scale_offset: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Each group's (scale, offset) [rows, groups, 2] as :class:`GroupCodes` stores them: in
    float16 times ``1 / mult`` (f16 holds up to 65504: a power of two puts the largest at
    ~2^14)."""
    largest = float(scale_offset.abs().max())
    exponent = 0 if largest == 0 else 14 - int(torch.tensor(largest).log2().floor())
    return (scale_offset * 2.0**exponent).to(torch.float16).contiguous(), 2.0**-exponent


def held_exactly(planes: Planes) -> bool:
    """Whether the group-code layout (our C and GPU kernels') stores these planes' scales and
    offsets without rounding them."""
    scale_offset = torch.stack((planes.scales[0], planes.offset), dim=-1)
    stored, mult = float16_scales(scale_offset)
    return bool(torch.equal(stored.float() * mult, scale_offset.float()))


class NativeWeight:
    """A [out, in] weight in the layout of our own C kernels (:class:`GroupCodes`).
    ``matmul(x)`` is ``x @ weight.T`` in float32, activations quantized to 8 bits per group."""

    def __init__(self, planes: Planes, lib) -> None:
        num_planes, rows, cols = planes.codes.shape
        self.lib, self.out_features, self.in_features = lib, rows, cols
        layout = group_codes(planes)
        self.kind, self.codes, self.scales, self.mult = (
            layout.kind,
            layout.codes,
            layout.scales,
            layout.mult,
        )
        self.struct = self.describe()

    def describe(self, bias: torch.Tensor | None = None):
        """The C structure for this matrix (with the layer's bias, if any)."""
        from ..kernels.cpu_native import QWeightStruct

        return QWeightStruct(
            self.kind,
            self.out_features,
            self.in_features,
            self.codes.data_ptr(),
            self.scales.data_ptr(),
            self.mult,
            None if bias is None else bias.data_ptr(),
        )

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows == 0:
            return x.new_empty((0, self.out_features))
        xf = x.float().contiguous()
        if rows > INTEGER_DOT_MAX_ROWS:
            out = self._widened_matmul(xf)
        else:
            out = torch.empty(rows, self.out_features)
            work = torch.empty(
                self.lib.qmatmul_work_bytes(rows, self.in_features), dtype=torch.uint8
            )
            self.lib.qmatmul(self.struct, xf.data_ptr(), rows, out.data_ptr(), work.data_ptr())
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def _widened_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """Many rows (a prefill): blocks of the weight widened to float32, multiplied by the BLAS,
        on the inputs rounded as the integer dots round them (the same product either way)."""
        x = x.clone()
        self.lib.round_activations(x.data_ptr(), x.shape[0], self.in_features)
        out = torch.empty(x.shape[0], self.out_features)
        block = max(1, min(self.out_features, WIDENED_BLOCK_FLOATS // self.in_features))
        widened = torch.empty(block, self.in_features)
        for start in range(0, self.out_features, block):
            rows = min(block, self.out_features - start)
            self.lib.qdequantize(self.struct, start, rows, widened.data_ptr())
            torch.mm(x, widened[:rows].t(), out=out[:, start : start + rows])
        return out


class NativeRows:
    """A tied embedding read from its LM head's codes (``NativeWeight``): one copy of the table
    serves both; a lookup widens only the rows it needs."""

    nbytes = 0  # counted with the LM head

    def __init__(self, head: NativeWeight) -> None:
        self.head = head

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.head.out_features):
            raise IndexError(f"token id out of range for a {self.head.out_features}-row embedding")
        out = torch.empty(flat.numel(), self.head.in_features)
        if flat.numel():
            self.head.lib.qdequantize_rows(
                self.head.struct, flat.data_ptr(), flat.numel(), out.data_ptr()
            )
        return out.to(dtype).reshape(*ids.shape, self.head.in_features)


def pack_weight(planes: Planes) -> NativeWeight | PackedWeight:
    """The fastest CPU form of these planes: our C kernels where they are built and take the
    shape, else torch's packed 4-bit kernel (a GPU's form: quantized_gpu.gpu_group_weight)."""
    from ..kernels.cpu_native import native_kernels

    lib = native_kernels()
    if lib is not None and planes.codes.shape[2] % (2 * GROUP) == 0 and planes.num_planes <= 2:
        try:
            return NativeWeight(planes, lib)
        except ValueError:
            pass
    return PackedWeight(planes)


class QuantizedRows:
    """An embedding table kept as its GGUF blocks; a lookup decodes only the rows it needs."""

    def __init__(self, raw: torch.Tensor, qtype: int, dim: int) -> None:
        self.raw, self.qtype, self.dim = raw, qtype, dim

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if ids.numel() == 0:
            return torch.empty((*ids.shape, self.dim), dtype=dtype)
        rows = self.raw.index_select(0, ids.reshape(-1))
        planes = gguf_planes(rows, self.qtype, self.dim)
        if planes is not None:
            values = planes.dequantize()
        else:
            values = dequantize_gguf(rows, self.qtype, (rows.shape[0], self.dim))
        return values.to(dtype).reshape(*ids.shape, self.dim)


def planes_of(
    raw: torch.Tensor, qtype: int, shape: tuple[int, int], device: torch.device | None = None
) -> Planes:
    """A GGUF matrix as planes on ``device`` (default: the CPU): exact where the type has a plane
    form, else re-quantized to 8 bits. On a GPU the blocks are decoded there (an 8B model's
    blocks decode in seconds instead of minutes on the CPU)."""
    planes = gguf_planes(raw if device is None else raw.to(device), qtype, shape[1])
    if planes is not None:
        return planes
    widened = dequantize_gguf(raw, qtype, shape)
    return int8_planes(widened if device is None else widened.to(device))


def stack_rows(parts: list[Planes]) -> Planes:
    """Parts of a merged matrix (q, k, v; gate, up) stacked by rows, with as many planes as the
    part that needs the most."""
    count = max(p.num_planes for p in parts)
    parts = [p.with_planes(count) for p in parts]
    return Planes(
        torch.cat([p.codes for p in parts], dim=1),
        torch.cat([p.scales for p in parts], dim=1),
        torch.cat([p.offset for p in parts], dim=0),
    )


def int4_checkpoint_planes(parts: list[Int4Weight], device: torch.device | None = None) -> Planes:
    """An AWQ/GPTQ matrix (its merged parts stacked by rows) as one 4-bit plane on ``device``:
    ``code * scale + offset``, the offset ``-zero * scale`` as the group-code layout stores it
    (``float16_scales``). Symmetric zero points (8) give offsets float16 holds exactly; the
    others are rounded to float16's precision, within 2^-11 of ``zero * scale`` (under 1% of a
    quantization step for zero <= 15), as GGUF's Q4_1 and Q4_K keep their minimums in float16.
    Exact 8-bit codes (``code - zero + 128``) would double the bytes every decode step reads."""
    parts = [part if device is None else part.to(device) for part in parts]
    planes = stack_rows([_zero_point_plane(part) for part in parts])
    stored, mult = float16_scales(torch.stack((planes.scales[0], planes.offset), dim=-1))
    stored = stored.float() * mult
    return Planes(planes.codes, stored[..., 0].unsqueeze(0), stored[..., 1])


def _per_group_of_32(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-group values [rows, in / group_size] as one per group of 32 inputs (float32)."""
    return values.float().repeat_interleave(group_size // GROUP, dim=1)


def _zero_point_plane(part: Int4Weight) -> Planes:
    scale = _per_group_of_32(part.scales, part.group_size)
    offset = -_per_group_of_32(part.zeros, part.group_size) * scale  # exact in float32
    return Planes(part.codes.unsqueeze(0), scale.unsqueeze(0), offset)


def quantize_float(weight: torch.Tensor, kind: str) -> Planes:
    """``--quantization int4 | int8`` of a float checkpoint's matrix."""
    return int4_planes(weight) if kind == "int4" else int8_planes(weight)


def drop_weight(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """A meta placeholder for a weight now held packed: the shape and dtype stay visible, any
    use of its values fails loudly."""
    return torch.nn.Parameter(
        torch.empty(param.shape, dtype=param.dtype, device="meta"), requires_grad=False
    )
