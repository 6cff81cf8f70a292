"""The paged KV pool: one K and one V tensor per layer, addressed by token slot.

A page is ``page_size`` consecutive slots; slot ``s`` lives in page ``s // page_size``. Pages
are handed out by :class:`~.page_allocator.PageAllocator`; this class only holds the memory,
plus one extra page (``padding_page``) that is never handed out: the rows a CUDA graph adds to
pad a batch to its captured size write their K/V there and attend to it.
"""

from __future__ import annotations

import torch


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
        shape = (num_layers, self.num_slots + page_size, num_kv_heads, head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K and V (shape [tokens, kv_heads, head_dim]) at their slots."""
        self.k_cache[layer_id].index_copy_(0, out_loc, k)
        self.v_cache[layer_id].index_copy_(0, out_loc, v)

    def paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V as [pages, page_size, kv_heads, head_dim] (FlashInfer's NHD)."""
        k, v = self.k_cache[layer_id], self.v_cache[layer_id]
        return k.view(-1, self.page_size, *k.shape[1:]), v.view(-1, self.page_size, *v.shape[1:])
