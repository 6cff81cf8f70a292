"""Maps (request slot, position) to the KV slot holding that token."""

from __future__ import annotations

import torch


class PageTable:
    """A ``[max_running_requests, max_context_len]`` table of KV slot indices.

    Each admitted request owns one row (its ``table_slot``). Storing token slots rather than
    page ids lets the torch attention backend gather K/V with one index op for any page size;
    page-based kernels read every ``page_size``-th entry divided by ``page_size``.
    """

    def __init__(self, max_running_requests: int, max_context_len: int, device: torch.device) -> None:
        self.table = torch.zeros((max_running_requests, max_context_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_running_requests - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write_pages(self, row: int, first_page_index: int, pages: list[int], page_size: int) -> None:
        """Fill the positions covered by ``pages`` (starting at page ``first_page_index`` of
        the request) with their slot numbers."""
        if not pages:
            return
        start = first_page_index * page_size
        slots = (torch.tensor(pages, dtype=torch.int64).unsqueeze(1) * page_size + torch.arange(page_size)).flatten()
        end = min(start + slots.numel(), self.table.shape[1])
        self.table[row, start:end] = slots[: end - start].to(self.table.device)
