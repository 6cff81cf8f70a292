"""A GGUF file's header read quickly: its scalar metadata and where each tensor lies.

The ``gguf`` package's reader builds a numpy view of every metadata item, the tokenizer's
vocabulary and merges included (~300,000 small arrays for a 49k-token vocabulary: seconds of
CPU per read, on the path of every start). This reader walks the same bytes with ``struct``,
skips arrays without building them, and maps the tensors' bytes once. Versions 2 and 3,
little-endian (what llama.cpp writes); anything else is refused with the reason.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types -> struct format (scalars); 8: string, 9: array
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

# GGML tensor types read as typed numbers (as the gguf package reads them); others as bytes
_NUMPY_TYPES = {
    0: np.float32,
    1: np.float16,
    24: np.int8,
    25: np.int16,
    26: np.int32,
    27: np.int64,
    28: np.float64,
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    qtype: int  # gguf.GGMLQuantizationType
    dims: tuple[int, ...]  # as stored: the innermost (contiguous) dimension first
    n_elements: int
    n_bytes: int
    offset: int  # from the start of the file


class GGUFIndex:
    """``metadata`` (scalar and string items; arrays are skipped) and ``tensors`` of a file;
    ``data(tensor)`` is a private copy of one tensor's values."""

    def __init__(self, path: str | Path) -> None:
        from gguf.constants import GGML_QUANT_SIZES

        self.path = Path(path)
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            reader = _HeaderReader(buf)
            if reader.raw(4) != GGUF_MAGIC:
                raise ValueError("not a GGUF file (bad magic)")
            version = reader.scalar("<I")
            if version not in (2, 3):
                raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
            tensor_count, kv_count = reader.scalar("<Q"), reader.scalar("<Q")
            self.metadata: dict[str, Any] = {}
            for _ in range(kv_count):
                key = reader.string()
                value = reader.value(reader.scalar("<I"))
                if value is not None:
                    self.metadata[key] = value
            infos = []
            for _ in range(tensor_count):
                name = reader.string()
                dims = tuple(reader.scalar("<Q") for _ in range(reader.scalar("<I")))
                qtype, offset = reader.scalar("<I"), reader.scalar("<Q")
                infos.append((name, dims, qtype, offset))
            alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            if alignment <= 0 or alignment & (alignment - 1):
                raise ValueError(f"bad general.alignment {alignment}")
            start = -(-reader.position // alignment) * alignment
        self.tensors: list[GGUFTensorInfo] = []
        for name, dims, qtype, offset in infos:
            n_elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            self.tensors.append(
                GGUFTensorInfo(
                    name,
                    qtype,
                    dims,
                    n_elements,
                    n_elements * type_size // block_size,
                    start + offset,
                )
            )
        self._map: np.memmap | None = None

    def data(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's values, flat: numbers for float and integer types, bytes otherwise."""
        if self._map is None:
            self._map = np.memmap(self.path, mode="r")
        raw = self._map[tensor.offset : tensor.offset + tensor.n_bytes]
        return np.array(raw.view(_NUMPY_TYPES.get(tensor.qtype, np.uint8)))


class _HeaderReader:
    """Reads the header's little-endian fields from the file's mapped bytes, in order."""

    def __init__(self, buffer) -> None:
        self.buffer = buffer
        self.position = 0

    def raw(self, n: int) -> bytes:
        end = self.position + n
        if end > len(self.buffer):
            raise ValueError("the GGUF header is truncated")
        data = self.buffer[self.position : end]
        self.position = end
        return bytes(data)

    def scalar(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        except struct.error:
            raise ValueError("the GGUF header is truncated") from None
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        return self.raw(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """A metadata value: scalars and strings; an array is skipped (None)."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            self.skip_array(item, count)
            return None
        raise ValueError(f"unknown GGUF metadata type {kind}")

    def skip_array(self, item: int, count: int) -> None:
        if item in _SCALARS:
            self.position += struct.calcsize(_SCALARS[item]) * count
        elif item == _STRING:
            unpack, position = struct.Struct("<Q").unpack_from, self.position
            try:
                for _ in range(count):
                    position += 8 + unpack(self.buffer, position)[0]
            except struct.error:
                raise ValueError("the GGUF header is truncated") from None
            self.position = position
        elif item == _ARRAY:
            for _ in range(count):
                self.skip_array(self.scalar("<I"), self.scalar("<Q"))
        else:
            raise ValueError(f"unknown GGUF metadata type {item}")
        if self.position > len(self.buffer):
            raise ValueError("the GGUF header is truncated")
