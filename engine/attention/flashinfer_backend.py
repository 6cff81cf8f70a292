"""FlashInfer paged attention (CUDA): one plan per batch, reused by every layer.

Prefill (a batch of new tokens, possibly after a cached prefix) runs FlashInfer's paged prefill
kernel with a causal mask; decode runs its tensor-core decode kernel (fast for grouped-query
attention). Both read the KV pool in place as ``[pages, page_size, kv_heads, head_dim]``.

A plan is built on the CPU from the batch's lengths and copied to the GPU; the page indices are
gathered from the page table on the GPU, so nothing here waits for the GPU. Decode batches that
replay a CUDA graph use a wrapper of their own whose index buffers the graph captured.

Small decode batches that replay a CUDA graph skip FlashInfer (and its plan) altogether: the
Triton kernels of :func:`..triton_kernels.decode_attention` read each request's length and KV
slots on the GPU, so such a step costs the CPU no planning (``MINISGL_DECODE_ATTENTION``).
Large ones whose requests are all short replay a graph planned to read each request's K/V whole,
without FlashInfer's split and merge (``DECODE_WHOLE_KV_FROM``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..batch import ForwardBatch
from ..env import env_choice, env_ints
from ..kernels.flashinfer_kernels import WORKSPACE_BYTES, pdl_wanted, triton_unavailable_reason
from ..kvcache.kv_pool import KVPool, is_fp8
from ..kvcache.page_table import PageTable
from ..transfer import host_tensor
from .base import AttentionBackend
from .flashinfer_layout import KVLayoutBuilder

TRITON_DECODE_MAX_BATCH = (
    16  # decode graphs of up to this many rows may run triton_kernels.decode_attention
)
TRITON_DECODE_MAX_CONTEXT = 4096  # ... while no request in the batch is longer than this (tokens; docs/benchmarks.md, fourth round)
# Decode graphs of this many rows or more have a second FlashInfer graph that reads each
# request's K/V whole, in one block per (request, KV head), instead of split into chunks merged by a
# second kernel; a step replays it while no request is longer than DECODE_WHOLE_KV_MAX_CONTEXT
# tokens. Under CUDA graphs FlashInfer's plan always splits (so that one graph fits any lengths),
# and the merge took 82-129 us a step at 64-256 rows (docs/benchmarks.md, thirteenth round): with
# short contexts that is time lost (the offline workload, contexts up to 2,048: 24,950-25,004
# against 24,827-24,901 tok/s split). With long ones the split is what keeps the GPU busy: 64 rows of
# 4,096 tokens decoded at 3,965 tok/s whole against 4,189 split (sixteenth round).
# ``MINISGL_DECODE_WHOLE_KV_FROM`` (rows) and ``MINISGL_DECODE_WHOLE_KV_MAX_CONTEXT`` (tokens)
# override them.
DECODE_WHOLE_KV_FROM = 64
DECODE_WHOLE_KV_MAX_CONTEXT = 2048

DECODE_ATTENTION_MODES = ("auto", "triton", "flashinfer", "fused")


@dataclass(frozen=True)
class DecodeAttentionLimits:
    """Up to how many graph rows and context tokens a decode step attends with the Triton
    kernels (``0, 0``: never). Which graphs are captured and which one a step replays both
    follow from these two numbers."""

    max_batch: int
    max_context: int
    fused: bool = False  # those steps attend straight from the qkv product, in one kernel per layer
    # FlashInfer graphs of this many rows or more read K/V unsplit while no request is longer than
    # whole_kv_max_context tokens (DECODE_WHOLE_KV_FROM)
    whole_kv_rows: int = DECODE_WHOLE_KV_FROM
    whole_kv_max_context: int = DECODE_WHOLE_KV_MAX_CONTEXT

    @classmethod
    def from_env(cls) -> DecodeAttentionLimits:
        """From ``MINISGL_DECODE_ATTENTION``: ``auto`` (default: small graphs and short contexts,
        where they were measured faster), ``triton`` (every graph, any length), ``flashinfer``
        (never) or ``fused`` (as ``auto``, with :func:`..triton_kernels.decode_attention_qkv`:
        faster for Qwen3-8B at batch 1, slower for Qwen3-0.6B; docs/benchmarks.md, seventh round)."""
        mode = env_choice("MINISGL_DECODE_ATTENTION", DECODE_ATTENTION_MODES)
        whole = dict(
            whole_kv_rows=env_ints(
                "MINISGL_DECODE_WHOLE_KV_FROM", ("rows",), (DECODE_WHOLE_KV_FROM,)
            )[0],
            whole_kv_max_context=env_ints(
                "MINISGL_DECODE_WHOLE_KV_MAX_CONTEXT", ("tokens",), (DECODE_WHOLE_KV_MAX_CONTEXT,)
            )[0],
        )
        if mode == "flashinfer" or triton_unavailable_reason() is not None:
            return cls(0, 0, **whole)
        if mode == "triton":
            return cls(1 << 30, 1 << 30, **whole)
        return cls(
            TRITON_DECODE_MAX_BATCH, TRITON_DECODE_MAX_CONTEXT, fused=mode == "fused", **whole
        )

    def graph_kinds(self, batch_size: int, max_context_len: int) -> list[str]:
        """The decode graphs captured for ``batch_size`` rows: every kind :meth:`decode_kind`
        may pick for a batch of requests up to ``max_context_len`` tokens long (it changes only
        where the longest request passes one of the two context limits)."""
        kinds: list[str] = []
        for longest in (1, self.max_context + 1, self.whole_kv_max_context + 1):
            kind = self.decode_kind(batch_size, [longest])
            if longest <= max_context_len and kind not in kinds:
                kinds.append(kind)
        return kinds

    def decode_kind(self, padded_size: int, seq_lens: list[int]) -> str:
        """The graph a decode batch padded to ``padded_size`` replays: ``triton`` while the
        graph is small and every request short; else FlashInfer, ``whole`` (K/V unsplit) while
        the graph is large and every request short enough, otherwise ``flashinfer`` (split)."""
        longest = max(seq_lens, default=0)
        if padded_size <= self.max_batch and longest <= self.max_context:
            return "triton"
        if padded_size >= self.whole_kv_rows and longest <= self.whole_kv_max_context:
            return "whole"
        return "flashinfer"


@dataclass
class TritonDecode:
    """The metadata of a decode batch on the Triton kernels (:func:`..triton_kernels.decode_attention`,
    or with ``fused`` :func:`..triton_kernels.decode_attention_qkv`): how many pieces each
    request's tokens are cut into (fixed per graph size), and for ``fused`` the counters with
    which the last piece of each (request, KV head) knows to merge (kept by the graph)."""

    num_splits: int
    pdl: bool
    fused: bool = False
    counters: torch.Tensor | None = None


def decode_uses_tensor_cores(
    num_heads: int, num_kv_heads: int, kv_dtype: torch.dtype | None = None
) -> bool:
    """FlashInfer's decode kernel on tensor cores or on CUDA cores (``MINISGL_DECODE_TENSOR_CORES``:
    ``auto``, or ``on``/``off`` for measuring). ``auto``: tensor cores once two or more query
    heads share a KV head, with a 16-bit pool. On an H200 the offline workload of the Qwen3-0.6B
    shape (2 query heads per KV head) ran 5% faster on them (23,274 / 23,392 against 22,388 /
    21,845 tok/s, runs interleaved; docs/benchmarks.md, twelfth round), where SGLang's rule (4 or
    more) kept CUDA cores. Over an FP8 pool they were slower at 2 per KV head (20,218 against
    21,722): there the rule stays 4 or more. Batches of up to 16 rows decode with the Triton
    kernels either way."""
    mode = env_choice("MINISGL_DECODE_TENSOR_CORES", ("auto", "on", "off"))
    if mode != "auto":
        return mode == "on"
    return num_heads // num_kv_heads >= (4 if kv_dtype is not None and is_fp8(kv_dtype) else 2)


class FlashInferAttentionBackend(AttentionBackend):
    def __init__(
        self,
        kv_pool: KVPool,
        page_table: PageTable,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        triton_decode: bool = True,
    ) -> None:
        super().__init__(kv_pool, page_table, num_heads, num_kv_heads, head_dim)
        import flashinfer

        self.dtype = dtype
        self.device = device
        self.page_size = kv_pool.page_size
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode_tensor_cores = decode_uses_tensor_cores(num_heads, num_kv_heads, kv_pool.dtype)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.decode_tensor_cores
        )
        self.kv_layout = KVLayoutBuilder(
            kv_pool, page_table, device, fill_indices=triton_unavailable_reason() is None
        )
        # (padded batch size, "flashinfer" or "whole") -> its wrapper
        self.graph_wrappers: dict[tuple[int, str], object] = {}
        self._graph_indices: torch.Tensor | None = None  # one index buffer shared by all graphs
        # FlashInfer copies each plan to the GPU from one pinned host buffer per wrapper; the
        # next plan must not overwrite it before that copy ran (with overlap scheduling the CPU
        # plans step N+1 while step N may not have started).
        self._plan_copied: torch.cuda.Event | None = None
        # the Triton kernels' shapes
        fits = head_dim & (head_dim - 1) == 0 and num_heads // num_kv_heads <= 16
        limits = DecodeAttentionLimits.from_env()
        if not (fits and triton_decode):
            limits = replace(limits, max_batch=0, max_context=0, fused=False)
        # K/V read whole was measured on the tensor-core decode only
        if not self.decode_tensor_cores:
            limits = replace(limits, whole_kv_rows=1 << 30)
        self.decode_limits = limits
        self.triton_graphs: dict[int, TritonDecode] = {}  # graph size -> its plan-free metadata

    # ---- CUDA graphs -------------------------------------------------------------------------

    def graph_kinds(self, batch_size: int, max_context_len: int) -> list[str]:
        """The decode graphs captured for ``batch_size`` rows (:class:`DecodeAttentionLimits`)."""
        return self.decode_limits.graph_kinds(batch_size, max_context_len)

    def graph_kind(self, batch: ForwardBatch) -> str:
        """Which of its size's graphs a planned decode batch replays."""
        if isinstance(batch.attn_metadata, TritonDecode):
            return "triton"
        return (
            "whole"
            if batch.attn_metadata is self.graph_wrappers.get((batch.padded_size, "whole"))
            else "flashinfer"
        )

    def graph_wrapper(self, batch_size: int, kind: str, max_pages_per_request: int):
        """What a graph of ``batch_size`` of this ``kind`` captures: FlashInfer's decode wrapper
        (fixed buffers, made once) or the Triton kernels' metadata."""
        import flashinfer

        if kind == "triton":
            from ..kernels.triton_kernels import (
                decode_attention_splits,  # Triton only where it is used
            )

            if batch_size not in self.triton_graphs:
                sms = torch.cuda.get_device_properties(self.device).multi_processor_count
                fused = self.decode_limits.fused
                counters = (
                    torch.zeros(
                        batch_size * self.num_kv_heads, dtype=torch.int32, device=self.device
                    )
                    if fused
                    else None
                )
                self.triton_graphs[batch_size] = TritonDecode(
                    decode_attention_splits(batch_size, self.num_kv_heads, sms),
                    pdl_wanted(self.device),
                    fused,
                    counters,
                )
            return self.triton_graphs[batch_size]
        if (batch_size, kind) not in self.graph_wrappers:
            need = batch_size * max_pages_per_request
            if self._graph_indices is None or self._graph_indices.numel() < need:
                self._graph_indices = torch.zeros(need, dtype=torch.int32, device=self.device)
            self.graph_wrappers[batch_size, kind] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.decode_tensor_cores,
                paged_kv_indptr_buffer=torch.zeros(
                    batch_size + 1, dtype=torch.int32, device=self.device
                ),
                paged_kv_indices_buffer=self._graph_indices,
                paged_kv_last_page_len_buffer=torch.zeros(
                    batch_size, dtype=torch.int32, device=self.device
                ),
            )
        return self.graph_wrappers[batch_size, kind]

    # ---- planning ----------------------------------------------------------------------------

    def decode_kind(self, batch: ForwardBatch) -> str:
        """The attention of a decode batch padded to a graph's size (:class:`DecodeAttentionLimits`)."""
        kind = self.decode_limits.decode_kind(batch.padded_size, batch.seq_lens)
        return (
            "flashinfer"
            if kind == "triton" and batch.padded_size not in self.triton_graphs
            else kind
        )

    def prepare(self, batch: ForwardBatch, kind: str | None = None) -> None:
        """``kind``: for a batch padded to a graph's size, force that graph kind (capture)."""
        if batch.is_decode and batch.use_graph:
            kind = kind or self.decode_kind(batch)
            if kind == "triton":
                batch.attn_metadata = self.triton_graphs[batch.padded_size]  # nothing to plan
                return
        layout = self.kv_layout.build(batch)
        if self._plan_copied is not None:
            self._plan_copied.synchronize()
        common = dict(
            q_data_type=self.dtype,
            kv_data_type=self.kv_pool.dtype,
            sm_scale=self.scale,
            non_blocking=True,
        )
        if batch.is_decode:
            # a graph's plan splits K/V or not as its kernels were captured (the same kind)
            wrapper = (
                self.graph_wrappers[batch.padded_size, kind]
                if batch.use_graph
                else self.decode_wrapper
            )
            wrapper.plan(
                layout.indptr,
                layout.indices,
                layout.last_page_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                **common,
                **({"disable_split_kv": True} if batch.use_graph and kind == "whole" else {}),
            )
        else:
            qo_indptr = [0]
            for n in batch.extend_lens:
                qo_indptr.append(qo_indptr[-1] + n)
            wrapper = self.prefill_wrapper
            wrapper.plan(
                host_tensor(qo_indptr, torch.int32),
                layout.indptr,
                layout.indices,
                layout.last_page_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                causal=True,
                **common,
            )
        self._plan_copied = torch.cuda.Event()
        self._plan_copied.record()
        batch.attn_metadata = wrapper

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer_id, batch.out_loc, k, v)
        return self.attend(q, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        """Attention over the pool, whose K/V for this step's tokens is already written (by
        the fused kernel of :mod:`..triton_kernels`)."""
        meta = batch.attn_metadata
        if isinstance(meta, TritonDecode):
            from ..kernels.triton_kernels import decode_attention

            return decode_attention(
                q,
                self.kv_pool.k_cache[layer_id],
                self.kv_pool.v_cache[layer_id],
                self.page_table.table,
                batch.token_rows,
                batch.positions,
                self.scale,
                meta.num_splits,
                meta.pdl,
            )
        out = meta.run(q, self.kv_pool.paged(layer_id))
        return out.view(q.shape[0], -1)

    def decode_from_qkv(
        self,
        qkv: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        cos_sin_cache: torch.Tensor,
    ) -> torch.Tensor | None:
        """With ``MINISGL_DECODE_ATTENTION=fused``, a decode graph on the Triton kernels attends
        in one kernel per layer (:func:`..triton_kernels.decode_attention_qkv`)."""
        meta = batch.attn_metadata
        if not isinstance(meta, TritonDecode) or not meta.fused:
            return None
        from ..kernels.triton_kernels import decode_attention_qkv

        return decode_attention_qkv(
            qkv,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            q_weight,
            k_weight,
            eps,
            cos_sin_cache,
            batch.out_loc,
            self.kv_pool.k_cache[layer_id],
            self.kv_pool.v_cache[layer_id],
            self.page_table.table,
            batch.token_rows,
            batch.positions,
            self.scale,
            meta.num_splits,
            meta.counters,
            meta.pdl,
        )
