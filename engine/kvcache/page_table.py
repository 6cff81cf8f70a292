"""Maps (request slot, position) to the KV slot holding that token."""

from __future__ import annotations

import torch


class PageTable:
    """A ``[max_running_requests, max_context_len]`` table of KV slot indices.

    Each admitted request owns one row (its ``table_slot``). Storing token slots rather than
    page ids lets the torch attention backend gather K/V with one index op for any page size;
    page-based kernels read every ``page_size``-th entry divided by ``page_size``.

    The table lives on the model's device, and the scheduler hands out pages one request at a
    time (every decode step, with ``page_size`` 1). Writing each of those at once would cost a
    copy to the GPU per request, each of which waits for the GPU to finish its queued work (a
    blocking copy): the CPU could never run ahead of the GPU. So :meth:`write_pages` only
    records the pages; the engine takes them (:meth:`take_pending`) into the one non-blocking
    copy of each step and writes them (:meth:`apply`) before the forward pass reads the table.
    """

    def __init__(
        self,
        max_running_requests: int,
        max_context_len: int,
        device: torch.device,
        page_size: int = 1,
    ) -> None:
        # a request's last page may reach past the context: room for all of it
        self.table = torch.zeros(
            (max_running_requests, max_context_len + page_size - 1),
            dtype=torch.int64,
            device=device,
        )
        self.page_size = page_size
        self._free_rows = list(range(max_running_requests - 1, -1, -1))
        # pages recorded since the last take_pending: row, first position (column) and page id of each
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._pages: list[int] = []

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        if row in self._rows:  # pages not written yet must not land in the row's next owner
            keep = [i for i, r in enumerate(self._rows) if r != row]
            self._rows = [self._rows[i] for i in keep]
            self._cols = [self._cols[i] for i in keep]
            self._pages = [self._pages[i] for i in keep]
        self._free_rows.append(row)

    def write_pages(self, row: int, first_page_index: int, pages: list[int]) -> None:
        """Map the positions covered by ``pages`` (starting at page ``first_page_index`` of
        the request) to their slot numbers, at the engine's next step."""
        if not pages:
            return
        page_size = self.page_size
        start = first_page_index * page_size
        self._rows.extend([row] * len(pages))
        self._cols.extend(range(start, start + len(pages) * page_size, page_size))
        self._pages.extend(pages)

    def take_pending(self) -> tuple[list[int], list[int], list[int]]:
        """The pages recorded since the last write (rows, first columns, page ids), for a caller
        that copies them to the device along with its own data and then calls :meth:`apply`."""
        pending = (self._rows, self._cols, self._pages)
        self._rows, self._cols, self._pages = [], [], []
        return pending

    def apply(self, rows: torch.Tensor, cols: torch.Tensor, pages: torch.Tensor) -> None:
        """Write pages (device tensors from :meth:`take_pending`) into the table."""
        if self.page_size == 1:
            self.table[rows, cols] = pages
            return
        offsets = torch.arange(self.page_size, device=self.table.device)
        # every position of each page (the table is wide enough for a last page past the context)
        self.table[rows.unsqueeze(1), cols.unsqueeze(1) + offsets] = (
            pages.unsqueeze(1) * self.page_size + offsets
        )
