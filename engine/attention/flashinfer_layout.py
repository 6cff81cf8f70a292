"""Which KV pages each request of a batch reads, in FlashInfer's paged layout (``indptr``,
``indices``, ``last_page_len``): the page ids gathered from the page table on the GPU, so that
planning never waits for the GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch
from ..kvcache.kv_pool import KVPool
from ..kvcache.page_table import PageTable
from ..transfer import host_tensor, to_device


@dataclass
class KVLayout:
    """FlashInfer's description of which pages each request reads."""

    indptr: torch.Tensor  # [batch + 1] int32, CPU: request i reads indices[indptr[i]:indptr[i+1]]
    indices: torch.Tensor  # [indptr[-1]] int32, GPU: page ids
    last_page_len: torch.Tensor  # [batch] int32, CPU: tokens used in each request's last page


class KVLayoutBuilder:
    def __init__(
        self, kv_pool: KVPool, page_table: PageTable, device: torch.device, fill_indices: bool
    ) -> None:
        """``fill_indices``: gather the page ids with one Triton launch instead of ~8 tensor ops."""
        self.kv_pool = kv_pool
        self.page_table = page_table
        self.page_size = kv_pool.page_size
        self.device = device
        self.fill_indices = fill_indices
        # page ids of eager batches
        self._indices = torch.empty(0, dtype=torch.int32, device=device)

    def build(self, batch: ForwardBatch) -> KVLayout:
        """Pages of every request (plus one padding page per padding row of a graph batch)."""
        ps = self.page_size
        seq_lens = batch.seq_lens
        counts = [(n + ps - 1) // ps for n in seq_lens]
        pad = batch.num_padding
        indptr = [0]
        for c in counts + [1] * pad:
            indptr.append(indptr[-1] + c)
        last_page_len = [(n - 1) % ps + 1 for n in seq_lens] + [1] * pad
        if self.fill_indices:
            from ..kernels.triton_kernels import fill_kv_indices

            if self._indices.numel() < indptr[-1]:
                self._indices = torch.empty(
                    max(indptr[-1], 2 * self._indices.numel()),
                    dtype=torch.int32,
                    device=self.device,
                )
            indices = fill_kv_indices(
                self.page_table.table,
                batch.table_rows,
                to_device(indptr, self.device, torch.int32),
                self._indices,
                ps,
                self.kv_pool.padding_page,
                max(counts + [1]),
            )[: indptr[-1]]
            return KVLayout(
                host_tensor(indptr, torch.int32), indices, host_tensor(last_page_len, torch.int32)
            )
        real_total = indptr[len(counts)]
        # page j of request i is slot table[row_i, j * page_size] // page_size
        meta = to_device(counts + indptr[: len(counts)], self.device)
        counts_gpu, starts_gpu = meta[: len(counts)], meta[len(counts) :]
        rows = batch.table_rows[: len(counts)].repeat_interleave(counts_gpu, output_size=real_total)
        cols = torch.arange(real_total, device=self.device) - starts_gpu.repeat_interleave(
            counts_gpu, output_size=real_total
        )
        table = self.page_table.table
        indices = table[rows, cols] if ps == 1 else table[rows, cols * ps] // ps
        if pad:
            indices = torch.cat(
                (
                    indices,
                    torch.full(
                        (pad,), self.kv_pool.padding_page, dtype=indices.dtype, device=self.device
                    ),
                )
            )
        return KVLayout(
            host_tensor(indptr, torch.int32),
            indices.to(torch.int32),
            host_tensor(last_page_len, torch.int32),
        )
