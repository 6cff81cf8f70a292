"""Reading a GGUF file's tensors under Hugging Face names, quantized blocks left as they are.

A converted GGUF folder (gguf_convert.py) holds the file itself as ``model.gguf``; the engine
reads its weights from there. Float tensors come out as torch tensors; quantized ones as
:class:`GGUFTensor` (the raw blocks of each row), which the model either repacks for the CPU
kernels (layers/quantized.py) or dequantizes (``--quantization none``, GPUs).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import WeightsError

GGUF_WEIGHTS = "model.gguf"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_SKIPPED = ("rope_freqs.weight",)  # Llama 3's frequency factors: computed from the config
_FLOAT_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}  # F32, F16, BF16


@dataclass
class GGUFTensor:
    """One quantized matrix: ``raw`` holds each of its ``shape[0]`` rows' blocks."""

    raw: torch.Tensor  # [rows, bytes per row] uint8
    qtype: int  # gguf.GGMLQuantizationType
    shape: tuple[int, int]  # (out, in), as torch.nn.Linear has it

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.qtype).name

    def dequantize(self) -> torch.Tensor:
        return dequantize_gguf(self.raw, self.qtype, self.shape)

    def narrow(self, dim: int, start: int, length: int) -> GGUFTensor:
        """Rows ``start`` to ``start + length`` (only whole rows can be cut from blocks)."""
        if dim != 0:
            raise WeightsError(
                "a quantized GGUF tensor can only be split by rows; use --quantization none"
            )
        return GGUFTensor(self.raw.narrow(0, start, length), self.qtype, (length, self.shape[1]))


def dequantize_gguf(
    raw: np.ndarray | torch.Tensor, qtype: int, shape: tuple[int, int]
) -> torch.Tensor:
    """float32 weights of GGUF blocks, by the ``gguf`` package's own decoder."""
    from gguf.quants import dequantize

    data = raw.numpy() if isinstance(raw, torch.Tensor) else raw
    return torch.from_numpy(
        np.ascontiguousarray(dequantize(data, qtype), dtype=np.float32)
    ).reshape(shape)


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor of a Llama/Qwen/Mistral model (None: skip it)."""
    if name in _SKIPPED:
        return None
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER_TENSOR.match(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise WeightsError(f"GGUF tensor {name!r} has no place in a Llama/Qwen/Mistral model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def _unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves the two rotary halves of each q/k head of a Llama
    model; put every head's rows back in Hugging Face order (whole rows, so blocks survive)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lies in a GGUF file (``shape`` as torch has it: outermost first)."""

    name: str
    shape: tuple[int, ...]
    qtype: int
    offset: int  # from the start of the file
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    """A GGUF file's scalar metadata and its tensors' places; arrays (the tokenizer's vocabulary
    and merges, ~100,000 strings) are skipped, not decoded: ``gguf.GGUFReader`` builds a numpy
    view of every one of them, which took seconds of each scheduler start."""

    metadata: dict[str, int | float | bool | str]
    tensors: list[GGUFTensorInfo]


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


def read_gguf_layout(path: Path) -> GGUFLayout:
    """The header of a little-endian GGUF file (versions 2 and 3), read in one pass."""
    try:
        data = path.read_bytes() if path.stat().st_size < 1 << 20 else None
        if data is None:
            import mmap

            with path.open("rb") as file:
                data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return _parse_layout(memoryview(data))
    except (OSError, ValueError, struct.error, IndexError, UnicodeDecodeError) as exc:
        raise WeightsError(f"could not read GGUF file {path}: {exc}") from exc


def _parse_layout(buf: memoryview) -> GGUFLayout:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    pos = 0

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("<Q")
        pos += length
        return bytes(buf[pos - length : pos]).decode("utf-8", errors="replace")

    def skip_value(kind: int) -> None:
        nonlocal pos
        if kind == _STRING:
            length = take("<Q")
            pos += length
        elif kind == _ARRAY:
            item, count = take("<I"), take("<Q")
            if item in _SCALARS:
                pos += count * struct.calcsize(_SCALARS[item])
            else:
                for _ in range(count):
                    skip_value(item)
        else:
            pos += struct.calcsize(_SCALARS[kind])

    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    pos = 4
    version = take("<I")
    if version not in (2, 3):
        raise ValueError(
            f"GGUF version {version} (big-endian or unknown); versions 2 and 3 are read"
        )
    n_tensors, n_kv = take("<Q"), take("<Q")
    metadata: dict[str, int | float | bool | str] = {}
    for _ in range(n_kv):
        key, kind = string(), take("<I")
        if kind == _STRING:
            metadata[key] = string()
        elif kind in _SCALARS:
            metadata[key] = take(_SCALARS[kind])
        else:
            skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        qtype, offset = take("<I"), take("<Q")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        numel = 1
        for dim in dims:
            numel *= dim
        infos.append((name, tuple(reversed(dims)), qtype, offset, numel // block * block_bytes))
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-pos // alignment) * alignment
    tensors = [GGUFTensorInfo(n, s, q, start + o, b) for n, s, q, o, b in infos]
    return GGUFLayout(metadata, tensors)


def iter_gguf(path: Path) -> Iterator[tuple[str, torch.Tensor | GGUFTensor]]:
    """``(hf_name, tensor)`` for every weight of the file, in file order."""
    layout = read_gguf_layout(path)
    arch = str(layout.metadata.get("general.architecture", ""))
    heads = layout.metadata.get(f"{arch}.attention.head_count")
    kv_heads = layout.metadata.get(f"{arch}.attention.head_count_kv") or heads
    file = np.memmap(path, dtype=np.uint8, mode="r")
    for info in layout.tensors:
        name = hf_name(info.name)
        if name is None:
            continue
        shape = info.shape
        # a private copy: the file may change under a memmap
        data = torch.from_numpy(np.array(file[info.offset : info.offset + info.nbytes]))
        if info.qtype in _FLOAT_TYPES:
            value: torch.Tensor | GGUFTensor = data.view(_FLOAT_TYPES[info.qtype]).reshape(shape)
        else:
            value = GGUFTensor(data.reshape(shape[0], -1), info.qtype, shape)
        if arch == "llama" and heads and name.endswith(("q_proj.weight", "k_proj.weight")):
            count = int(heads if "q_proj" in name else kv_heads)
            if isinstance(value, GGUFTensor):
                value = GGUFTensor(_unpermute_rows(value.raw, count), info.qtype, shape)
            else:
                value = _unpermute_rows(value, count)
        yield name, value
    del file


def gguf_weights_nbytes(path: Path, dtype: torch.dtype | None) -> int:
    """Bytes the weights take: quantized ones as stored (``dtype`` None) or widened to ``dtype``."""
    total = 0
    for info in read_gguf_layout(path).tensors:
        if dtype is None:
            total += info.nbytes
        else:
            numel = 1
            for dim in info.shape:
                numel *= dim
            total += numel * dtype.itemsize
    return total
