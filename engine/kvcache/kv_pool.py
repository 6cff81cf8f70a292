"""The paged KV pool: one K and one V tensor per layer, addressed by token slot.

A page is ``page_size`` consecutive slots; slot ``s`` lives in page ``s // page_size``. Pages
are handed out by :class:`~.page_allocator.PageAllocator`; this class only holds the memory,
plus one extra page (``padding_page``) that is never handed out: the rows a CUDA graph adds to
pad a batch to its captured size write their K/V there and attend to it.

The pool is kept in the model's dtype, or with ``--kv-dtype fp8`` in FP8 (e4m3, no scale):
half the bytes of bf16, so twice the tokens fit and a decode step reads half as much K/V, at
the cost of precision (3 mantissa bits: about one significant decimal digit; docs/benchmarks.md,
eleventh round). Values are rounded once, when stored; every attention kernel widens them back
as it reads them.
"""

from __future__ import annotations

import torch

from ..errors import UserError

KV_DTYPES = {"fp8": torch.float8_e4m3fn}  # --kv-dtype choices besides ``auto`` (the model's dtype)


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """``--kv-dtype``: ``auto`` keeps the model's dtype."""
    if name == "auto":
        return model_dtype
    if name not in KV_DTYPES:
        raise UserError(f"--kv-dtype {name!r}: choose auto or {', '.join(KV_DTYPES)}")
    return KV_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in KV_DTYPES.values()


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        self.padding_page = num_pages
        self.padding_slot = num_pages * page_size
        self.dtype = dtype
        self.quantized = is_fp8(dtype)
        shape = (num_layers, self.num_slots + page_size, num_kv_heads, head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K and V (shape [tokens, kv_heads, head_dim]) at their slots."""
        if self.quantized:  # index_copy_ has no FP8 kernels: copy the rounded values as bytes
            self.k_cache[layer_id].view(torch.uint8).index_copy_(0, out_loc, k.to(self.dtype).view(torch.uint8))
            self.v_cache[layer_id].view(torch.uint8).index_copy_(0, out_loc, v.to(self.dtype).view(torch.uint8))
            return
        self.k_cache[layer_id].index_copy_(0, out_loc, k)
        self.v_cache[layer_id].index_copy_(0, out_loc, v)

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [tokens, kv_heads, head_dim] as attention reads it back from the pool: rounded
        to FP8 and widened again when the pool is FP8, else ``x`` itself."""
        return x.to(self.dtype).to(x.dtype) if self.quantized else x

    def paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V as [pages, page_size, kv_heads, head_dim] (FlashInfer's NHD)."""
        k, v = self.k_cache[layer_id], self.v_cache[layer_id]
        return k.view(-1, self.page_size, *k.shape[1:]), v.view(-1, self.page_size, *v.shape[1:])
