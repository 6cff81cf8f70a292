"""Reading a GGUF file's tensors under Hugging Face names, quantized blocks left as they are.

A converted GGUF folder (gguf_convert.py) holds the file itself as ``model.gguf``; the engine
reads its weights from there. Float tensors come out as torch tensors; quantized ones as
:class:`GGUFTensor` (the raw blocks of each row), which the model either repacks for the CPU
kernels (layers/quantized.py) or dequantizes (``--quantization none``, GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import WeightsError
from .layout import GGUF_WEIGHTS  # noqa: F401 (this module's name too)

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


def iter_gguf(path: Path) -> Iterator[tuple[str, torch.Tensor | GGUFTensor]]:
    """``(hf_name, tensor)`` for every weight of the file, in file order."""
    from .gguf_index import GGUFIndex

    try:
        index = GGUFIndex(path)
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(f"could not read GGUF file {path}: {exc}") from exc
    arch = str(index.metadata.get("general.architecture", ""))
    heads = index.metadata.get(f"{arch}.attention.head_count")
    kv_heads = index.metadata.get(f"{arch}.attention.head_count_kv") or heads
    for tensor in index.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        qtype = tensor.qtype
        shape = tuple(reversed(tensor.dims))
        data = index.data(tensor)  # a private copy: the file may change under a memmap
        if qtype in _FLOAT_TYPES:
            value: torch.Tensor | GGUFTensor = torch.from_numpy(data).reshape(shape)
        else:
            value = GGUFTensor(torch.from_numpy(data).reshape(shape[0], -1), qtype, shape)
        if arch == "llama" and heads and name.endswith(("q_proj.weight", "k_proj.weight")):
            count = heads if "q_proj" in name else kv_heads
            if isinstance(value, GGUFTensor):
                value = GGUFTensor(_unpermute_rows(value.raw, count), qtype, shape)
            else:
                value = _unpermute_rows(value, count)
        yield name, value


def gguf_weights_nbytes(path: Path, dtype: torch.dtype | None) -> int:
    """Bytes the weights take: quantized ones as stored (``dtype`` None) or widened to ``dtype``."""
    from .gguf_index import GGUFIndex

    size = None if dtype is None else torch.empty((), dtype=dtype).element_size()
    return sum(t.n_bytes if size is None else t.n_elements * size for t in GGUFIndex(path).tensors)
