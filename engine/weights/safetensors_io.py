"""Reading a Hugging Face folder's safetensors weights, one shard at a time.

Every problem with the files becomes a one-line :class:`WeightsError` naming the file, so a
truncated download is reported as such instead of as a traceback from deep inside a loader.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..errors import WeightsError
from .layout import INDEX_FILE, SINGLE_FILE, weight_files  # noqa: F401 (this module's names too)

# Stored dtype names (safetensors header) -> bytes per element; floating types are the ones a
# load-time dtype cast applies to.
_FLOAT_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_OTHER_SIZES = {
    "I64": 8,
    "U64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def _corrupt(file: Path, exc: BaseException) -> WeightsError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return WeightsError(
        f"cannot read weights file {file} ({reason}); it is probably truncated "
        "or corrupt, download the model again"
    )


class LazySlice:
    """A checkpoint tensor not read yet. Narrowing it and then reading reads only the chosen
    block from the file: a tensor-parallel rank loads its own slice of each weight, not the
    whole model."""

    def __init__(
        self, file: Path, handle, shape: tuple[int, ...], index: tuple[slice, ...] | None = None
    ) -> None:
        self.file = file
        self._handle = handle
        self.shape = torch.Size(shape)
        self._index = index or tuple(slice(0, n) for n in shape)

    def dim(self) -> int:
        return len(self.shape)

    @property
    def dtype_name(self) -> str:
        """The stored dtype as the file names it ("BF16", "F8_E4M3", ...)."""
        return self._handle.get_dtype()

    def narrow(self, dim: int, start: int, length: int) -> LazySlice:
        index = list(self._index)
        base = index[dim].start
        index[dim] = slice(base + start, base + start + length)
        shape = list(self.shape)
        shape[dim] = length
        return LazySlice(self.file, self._handle, tuple(shape), tuple(index))

    def __getitem__(self, rows: slice) -> LazySlice:
        start, stop, _ = rows.indices(self.shape[0])
        return self.narrow(0, start, max(stop - start, 0))

    def read(self) -> torch.Tensor:
        try:
            return self._handle[self._index if self.dim() else ...]
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise _corrupt(self.file, exc) from exc


def read_tensor(loaded: torch.Tensor | LazySlice) -> torch.Tensor:
    return loaded.read() if isinstance(loaded, LazySlice) else loaded


def iter_safetensors(
    model_dir: Path, lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor | LazySlice]]:
    """Yield ``(name, tensor)`` for every stored tensor, opening each shard once; ``lazy``
    yields :class:`LazySlice` handles instead, valid until the next item."""
    for file in weight_files(model_dir):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if lazy:
                        handle = f.get_slice(name)
                        yield name, LazySlice(file, handle, tuple(handle.get_shape()))
                    else:
                        yield name, f.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise _corrupt(file, exc) from exc


def _read_header(file: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000 or length > file.stat().st_size - 8:
                raise ValueError("header length exceeds the file size")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        return header
    except (OSError, ValueError, struct.error) as exc:
        raise _corrupt(file, exc) from exc


def weights_nbytes(
    model_dir: Path, dtype: torch.dtype | None, keep_gguf_blocks: bool = False
) -> int:
    """Bytes the weights take once floating tensors are cast to ``dtype`` (None: as stored); a
    GGUF folder's quantized blocks as stored when ``keep_gguf_blocks`` (the CPU's packed path).

    Only the headers are read, so this is cheap enough for a "does it fit" check before loading.
    """
    from .gguf_tensors import GGUF_WEIGHTS, gguf_weights_nbytes

    if (model_dir / GGUF_WEIGHTS).is_file():
        return gguf_weights_nbytes(model_dir / GGUF_WEIGHTS, None if keep_gguf_blocks else dtype)
    total = 0
    for file in weight_files(model_dir):
        for name, info in _read_header(file).items():
            if name == "__metadata__":
                continue
            try:
                stored, shape = info["dtype"], info["shape"]
                numel = 1
                for dim in shape:
                    numel *= int(dim)
                if dtype is not None and stored in _FLOAT_SIZES:
                    total += numel * dtype.itemsize
                elif stored in _FLOAT_SIZES or stored in _OTHER_SIZES:
                    total += numel * (_FLOAT_SIZES | _OTHER_SIZES)[stored]
                else:  # an unusual dtype: trust the stored byte range
                    begin, end = info["data_offsets"]
                    total += int(end) - int(begin)
            except (KeyError, TypeError, ValueError) as exc:
                raise _corrupt(file, ValueError(f"bad header entry for {name!r}")) from exc
    return total
