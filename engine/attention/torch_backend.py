"""Pure-torch attention over the paged KV pool (CPU, and the CUDA fallback).

Prefill attends each request's new tokens to its cached prefix plus themselves (causal);
decode gathers every request's K/V rows into one padded batch and masks the padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..batch import ForwardBatch
from .base import AttentionBackend


@dataclass
class _PrefillSeq:
    start: int  # first row of this request's tokens in the batch
    end: int
    kv_indices: torch.Tensor | None  # KV slots of the whole sequence; None = no cached prefix
    mask: torch.Tensor | None  # [extend, seq] causal mask offset by the cached length


@dataclass
class _DecodeMeta:
    kv_indices: torch.Tensor  # [batch, max_seq_len]
    mask: torch.Tensor | None  # [batch, 1, 1, max_seq_len]; None when no row is padded
    # one request whose slots are one run (the usual case for a lone chat on CPU): attention
    # reads the pool's rows start:end in place, no gather
    slot_run: tuple[int, int] | None = None
    # CPU, one request: its slots (int64, the new token's last), for the C decode steps
    one_request_slots: torch.Tensor | None = None


def _one_request_slots(kv_indices: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor | None:
    """One request's slots on CPU, the new token's the last of them (None otherwise)."""
    if (
        kv_indices.shape[0] != 1
        or kv_indices.device.type != "cpu"
        or kv_indices.dtype != torch.int64
    ):
        return None
    row = kv_indices[0]
    return row if row.is_contiguous() and int(row[-1]) == int(out_loc[0]) else None


def _slot_run(slots: torch.Tensor | None) -> tuple[int, int] | None:
    """(start, end) when one request's slots are start, start + 1, ..., end - 1."""
    if slots is None:
        return None
    start, last = int(slots[0]), int(slots[-1])
    if last - start + 1 != slots.shape[0] or not bool((slots.diff() == 1).all()):
        return None
    return start, last + 1


class TorchAttentionBackend(AttentionBackend):
    def prepare(self, batch: ForwardBatch) -> None:
        table = self.page_table.table
        if batch.is_decode:
            max_len = max(batch.seq_lens)
            kv_indices = table[batch.table_rows, :max_len]
            mask = None
            if min(batch.seq_lens) != max_len:
                seq_lens = torch.tensor(batch.seq_lens, device=table.device)
                mask = (torch.arange(max_len, device=table.device) < seq_lens[:, None])[
                    :, None, None, :
                ]
            slots = _one_request_slots(kv_indices, batch.out_loc) if mask is None else None
            batch.attn_metadata = _DecodeMeta(kv_indices, mask, _slot_run(slots), slots)
            return
        seqs = []
        start = 0
        rows = batch.table_rows.tolist()
        for row, cached, extend in zip(rows, batch.cached_lens, batch.extend_lens):
            end = start + extend
            if cached == 0:
                seqs.append(_PrefillSeq(start, end, None, None))
            else:
                seq_len = cached + extend
                q_pos = torch.arange(cached, seq_len, device=table.device)
                mask = torch.arange(seq_len, device=table.device)[None, :] <= q_pos[:, None]
                seqs.append(_PrefillSeq(start, end, table[row, :seq_len], mask))
            start = end
        batch.attn_metadata = seqs

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer_id, batch.out_loc, k, v)
        return self._attend(q, k, v, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        # this step's K/V were written by a fused kernel: read them back from their slots
        k = self.kv_pool.k_cache[layer_id][batch.out_loc].to(q.dtype)
        v = self.kv_pool.v_cache[layer_id][batch.out_loc].to(q.dtype)
        return self._attend(q, k, v, layer_id, batch)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        k_cache = self.kv_pool.k_cache[layer_id]
        v_cache = self.kv_pool.v_cache[layer_id]
        if batch.is_decode:
            meta: _DecodeMeta = batch.attn_metadata
            # [batch, heads, 1, dim] against [batch, kv_heads, len, dim]
            qb = q.unsqueeze(2)
            if meta.slot_run is not None:
                start, end = meta.slot_run
                kb = k_cache[start:end].transpose(0, 1).unsqueeze(0).to(q.dtype)
                vb = v_cache[start:end].transpose(0, 1).unsqueeze(0).to(q.dtype)
                out = F.scaled_dot_product_attention(qb, kb, vb, scale=self.scale, enable_gqa=True)
                return out.reshape(q.shape[0], -1)
            flat = meta.kv_indices.view(-1)
            shape = (*meta.kv_indices.shape, self.num_kv_heads, self.head_dim)
            kb = (
                k_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)
            )  # widened from FP8 (--kv-dtype)
            vb = v_cache.index_select(0, flat).view(shape).transpose(1, 2).to(q.dtype)
            out = F.scaled_dot_product_attention(
                qb, kb, vb, attn_mask=meta.mask, scale=self.scale, enable_gqa=True
            )
            return out.reshape(q.shape[0], -1)
        outs = []
        for seq in batch.attn_metadata:
            # [1, heads, tokens, dim]: with a batch dimension torch's CPU flash kernel runs; 3-D
            # inputs take the math path, which materialises every score (4.5x slower at 1,024 tokens)
            qs = q[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
            if seq.kv_indices is None:
                # as the pool holds them (rounded to FP8 with --kv-dtype fp8), like every later step reads them
                ks = self.kv_pool.as_stored(k[seq.start : seq.end]).transpose(0, 1).unsqueeze(0)
                vs = self.kv_pool.as_stored(v[seq.start : seq.end]).transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=True
                )
            else:
                ks = k_cache[seq.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
                vs = v_cache[seq.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
                o = F.scaled_dot_product_attention(
                    qs, ks, vs, attn_mask=seq.mask, scale=self.scale, enable_gqa=True
                )
            outs.append(o[0].transpose(0, 1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return out.reshape(q.shape[0], -1)
