"""The paged KV pool: one K and one V tensor per layer, addressed by token slot.

A page is ``page_size`` consecutive slots; slot ``s`` lives in page ``s // page_size``. Pages
are handed out by :class:`~.page_allocator.PageAllocator`; this class only holds the memory,
plus one extra page (``padding_page``) that is never handed out: the rows a CUDA graph adds to
pad a batch to its captured size write their K/V there and attend to it.

Storage (``--kv-dtype``): on a GPU the model's dtype, or FP8 (e4m3, no scale): half the bytes
of bf16, so twice the tokens fit and a decode step reads half as much K/V, at the cost of
precision (3 mantissa bits: about one significant decimal digit; docs/benchmarks.md, eleventh
round). On CPU float16 by default: half of float32's bytes, with the demo model's greedy replies
unchanged (scripts/cpu_agreement.py --kv-dtype). Values are rounded once, when stored; every
attention kernel widens them back as it reads them.

On CPU the pool's memory is an anonymous mapping: the OS gives its pages zero-filled on first
touch, so the pool becomes resident only as far as requests write it, and :meth:`KVPool.release`
hands the memory of free pages back (``MADV_DONTNEED``; a later read sees zeros again).
"""

from __future__ import annotations

import ctypes
import math
import mmap

import torch

from ..errors import UserError

# --kv-dtype choices besides ``auto``
KV_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
CPU_KV_DTYPE = torch.float16
"""``auto`` on CPU for a float32 model. float16 rather than bfloat16: three more mantissa bits
(K and V of the models we serve stay far inside float16's range), and the F16C instructions
widen it in the C decode step. Against a float32 cache on the demo model (scripts/cpu_agreement.py
--kv-dtype): float16 gave every greedy reply of six chat prompts unchanged for 64 tokens; bfloat16
parted one after 6 tokens ("What is 12 times 7?")."""


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, device_type: str = "cpu") -> torch.dtype:
    """``--kv-dtype``: ``auto`` is :data:`CPU_KV_DTYPE` for a float32 model on CPU, else the
    model's dtype. A GPU takes its model's dtype or FP8 (its kernels read no other mix)."""
    if name == "auto":
        return (
            CPU_KV_DTYPE if device_type == "cpu" and model_dtype == torch.float32 else model_dtype
        )
    if name not in KV_DTYPES:
        raise UserError(f"--kv-dtype {name!r}: choose auto, {', '.join(KV_DTYPES)}")
    dtype = KV_DTYPES[name]
    if device_type != "cpu" and not is_fp8(dtype) and dtype != model_dtype:
        raise UserError(
            f"--kv-dtype {name} on a GPU: choose auto (the model's {str(model_dtype).removeprefix('torch.')}) or fp8"
        )
    return dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.padding_page = num_pages
        self.padding_slot = num_pages * page_size
        self.dtype = dtype
        self.quantized = is_fp8(dtype)
        shape = (num_layers, self.num_slots + page_size, num_kv_heads, head_dim)
        self._maps: list[mmap.mmap] = []  # CPU: the anonymous mappings behind k_cache and v_cache
        self.k_cache = self._zeros(shape, dtype, torch.device(device))
        self.v_cache = self._zeros(shape, dtype, torch.device(device))

    def _zeros(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A zero tensor; on CPU in an anonymous mapping, so that no page is resident until written
        (``torch.zeros`` writes every byte: an idle app would hold the whole pool)."""
        if device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=device)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        # private: Python's default, a shared mapping, is shared memory, which MADV_DONTNEED keeps
        mapped = (
            -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        )  # whole OS pages: the last one can go too
        mapping = mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._maps.append(mapping)
        return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)

    @property
    def releasable(self) -> bool:
        """Whether :meth:`release` gives memory back (a CPU pool)."""
        return bool(self._maps)

    def release(self, free_runs: list[tuple[int, int]]) -> int:
        """Give the memory of free pages back to the OS: ``free_runs`` are runs [start, end) of
        pages no one holds. Only whole OS pages inside a run go (a neighbour's K/V stays); a
        later read of a released slot sees zeros. Returns the bytes released."""
        if not self._maps:
            return 0
        # the padding page goes too: only a CUDA graph's padding rows write it, and read it back
        spans = self._byte_spans(sorted([*free_runs, (self.padding_page, self.padding_page + 1)]))
        released = 0
        for mapping in self._maps:
            for lo, hi in spans:
                hi = (
                    len(mapping) if hi == self.k_cache.nbytes else hi
                )  # the tail past the tensor is unused
                lo, hi = (
                    -(-lo // mmap.PAGESIZE) * mmap.PAGESIZE,
                    hi // mmap.PAGESIZE * mmap.PAGESIZE,
                )
                if hi > lo:
                    mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                    released += hi - lo
        return released

    def _byte_spans(self, runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Where runs [start, end) of pages lie in one cache tensor's bytes, in every layer, with
        spans that touch merged (a run to the end of a layer and one from the start of the next
        are one span: the OS page across the boundary goes too)."""
        page_bytes, layer_bytes = self.k_cache[0, 0].nbytes * self.page_size, self.k_cache[0].nbytes
        spans: list[tuple[int, int]] = []
        for layer in range(self.k_cache.shape[0]):
            for start, end in runs:
                lo, hi = (
                    layer * layer_bytes + start * page_bytes,
                    layer * layer_bytes + end * page_bytes,
                )
                if spans and spans[-1][1] == lo:
                    spans[-1] = (spans[-1][0], hi)
                else:
                    spans.append((lo, hi))
        return spans

    def resident_bytes(self) -> int | None:
        """Bytes of the CPU pool held in memory now (``mincore``); None where it cannot be told."""
        if not self._maps:
            return None
        try:
            mincore = ctypes.CDLL(None, use_errno=True).mincore
        except (OSError, AttributeError):
            return None
        resident = 0
        for tensor, mapping in zip((self.k_cache, self.v_cache), self._maps):
            pages = -(-len(mapping) // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if mincore(ctypes.c_void_p(tensor.data_ptr()), ctypes.c_size_t(len(mapping)), vec) != 0:
                return None
            resident += sum(b & 1 for b in vec) * mmap.PAGESIZE
        return resident

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return (
            2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        )

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K and V (shape [tokens, kv_heads, head_dim]) at their slots,
        rounded to the pool's dtype."""
        if self.quantized:  # index_copy_ has no FP8 kernels: copy the rounded values as bytes
            self.k_cache[layer_id].view(torch.uint8).index_copy_(
                0, out_loc, k.to(self.dtype).view(torch.uint8)
            )
            self.v_cache[layer_id].view(torch.uint8).index_copy_(
                0, out_loc, v.to(self.dtype).view(torch.uint8)
            )
            return
        self.k_cache[layer_id].index_copy_(0, out_loc, k.to(self.dtype))
        self.v_cache[layer_id].index_copy_(0, out_loc, v.to(self.dtype))

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [tokens, kv_heads, head_dim] as attention reads it back from the pool: rounded
        to the pool's dtype and widened again when that is narrower, else ``x`` itself."""
        return x.to(self.dtype).to(x.dtype) if self.dtype != x.dtype else x

    def paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V as [pages, page_size, kv_heads, head_dim] (FlashInfer's NHD)."""
        k, v = self.k_cache[layer_id], self.v_cache[layer_id]
        return k.view(-1, self.page_size, *k.shape[1:]), v.view(-1, self.page_size, *v.shape[1:])
