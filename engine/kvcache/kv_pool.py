"""The paged KV pool: one K and one V tensor per layer, addressed by token slot.

A page is ``page_size`` consecutive slots; slot ``s`` lives in page ``s // page_size``. Pages
are handed out by :class:`~.page_allocator.PageAllocator`; this class only holds the memory.
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
        shape = (num_layers, self.num_slots, num_kv_heads, head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def store(self, layer_id: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the new tokens' K and V (shape [tokens, kv_heads, head_dim]) at their slots."""
        self.k_cache[layer_id].index_copy_(0, out_loc, k)
        self.v_cache[layer_id].index_copy_(0, out_loc, v)
