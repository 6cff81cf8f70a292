"""CUDA graphs for decode steps.

A decode step of a small model is hundreds of tiny kernels; launched one by one from Python each
costs ~10 µs of CPU time, inside a replayed graph under 1 µs. So at start-up we capture one
graph of the whole model forward (embedding to logits) per batch size in ``capture_sizes``; a
decode batch is padded up to the nearest captured size and replayed. Sampling stays outside the
graph (its parameters change per request).

The graphs read their inputs from fixed buffers (token ids, positions, KV slots) and FlashInfer's
fixed index buffers, which each step's plan refills; they share one memory pool. Small sizes
have a second graph whose attention runs the Triton decode kernels, which need no plan: they
read each row's page-table row from one more fixed buffer (``token_rows``). Large sizes have a
second FlashInfer graph that reads each request's K/V whole, for steps whose requests are all
short (attention/flashinfer_backend.py: graph_kinds).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator

import torch

from ..batch import ForwardBatch

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def no_collection_while_capturing() -> Iterator[None]:
    """Collect Python's garbage once, then keep the collector off while CUDA graphs are captured.

    An engine dropped in a reference cycle (an ``LLM`` deleted in a process that makes another)
    is freed by the collector, at whatever allocation it runs; freeing its CUDA graphs inside
    another capture is an operation a capturing stream does not permit, and that capture fails
    ("operation failed due to a previous error during capture"), leaving the CUDA generator in a
    broken state for the rest of the process. torch no longer collects before a capture."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def capture_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 16 up to 256, every 32 beyond (SGLang-like):
    padding wastes at most a few rows while the number of graphs stays small."""
    sizes = (
        [1, 2, 4]
        + list(range(8, 64, 8))
        + list(range(64, 256, 16))
        + list(range(256, max_batch_size + 32, 32))
    )
    return sorted({min(s, max_batch_size) for s in sizes if s <= max_batch_size} | {max_batch_size})


class CudaGraphRunner:
    def __init__(
        self, engine, max_batch_size: int, on_phase: Callable[[str], None] | None = None
    ) -> None:
        self.engine = engine
        self.sizes = capture_sizes(max_batch_size)
        self.max_batch_size = self.sizes[-1]
        device = engine.device
        n = self.max_batch_size
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_loc = torch.full(
            (n,), engine.kv_pool.padding_slot, dtype=torch.int64, device=device
        )
        self.token_rows = torch.zeros(
            n, dtype=torch.int64, device=device
        )  # padding rows read row 0
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=device)
        # one output buffer for every graph: outputs held per graph would pin their memory
        self.logits = torch.zeros(
            n, engine.model_config.vocab_size, dtype=torch.float32, device=device
        )
        # (batch size, attention kind) -> graph: small sizes have one attending with the Triton
        # kernels and one with FlashInfer, large ones one reading K/V whole and one split
        # (attention/flashinfer_backend.py: graph_kinds)
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
        self.last_graph: tuple[int, str] | None = (
            None  # (size, kind) of the latest replay: profiles and tests read it
        )
        self._capture(on_phase)

    def size_for(self, batch_size: int) -> int | None:
        """The captured size a decode batch of ``batch_size`` is padded to (None: too big)."""
        i = bisect.bisect_left(self.sizes, batch_size)
        return self.sizes[i] if i < len(self.sizes) else None

    @torch.inference_mode()
    def _capture(self, on_phase: Callable[[str], None] | None) -> None:
        engine = self.engine
        attn = engine.attn_backend
        max_pages = -(-engine.max_context_len // engine.page_size)
        # largest first, so the smaller graphs reuse the largest one's memory from the pool
        shapes = [
            (bs, kind)
            for bs in sorted(self.sizes, reverse=True)
            for kind in attn.graph_kinds(bs, engine.max_context_len)
        ]
        message = f"capturing CUDA graphs for decode batch sizes 1..{self.max_batch_size} ({len(shapes)} graphs)"
        logger.info(message)
        if on_phase is not None:
            on_phase(message)
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=engine.device)
        with no_collection_while_capturing():
            self._capture_shapes(shapes, pool, stream, max_pages)
        torch.cuda.synchronize(engine.device)
        self.capture_s = time.perf_counter() - start  # reported in the ready line
        logger.info("captured %d CUDA graphs in %.1f s", len(shapes), self.capture_s)

    def _capture_shapes(
        self, shapes: list[tuple[int, str]], pool, stream: torch.cuda.Stream, max_pages: int
    ) -> None:
        """One graph per (batch size, attention kind), each after two warm-up runs."""
        from tqdm import tqdm

        engine = self.engine
        attn = engine.attn_backend
        for bs, kind in tqdm(shapes, desc="CUDA graphs", unit="graph", leave=False):
            attn.graph_wrapper(bs, kind, max_pages)
            fb = ForwardBatch(
                phase="decode",
                input_ids=self.input_ids[:bs],
                positions=self.positions[:bs],
                out_loc=self.out_loc[:bs],
                table_rows=torch.zeros(0, dtype=torch.int64, device=engine.device),
                cached_lens=[],
                extend_lens=[],
                seq_lens=[],
                logits_indices=self.logits_indices[:bs],
                num_padding=bs,  # every row a padding row: each reads the padding page
                use_graph=True,
                token_rows=self.token_rows[:bs],
            )
            attn.prepare(fb, kind=kind)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up runs outside the graph (allocator, lazy inits)
                    engine.model(fb, attn)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    engine.model(fb, attn, logits_out=self.logits[:bs])
            torch.cuda.current_stream().wait_stream(stream)
            self.graphs[bs, kind] = graph

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [padded size, vocab] of a decode batch that ``Engine.prepare`` padded and the
        attention backend planned on this size's wrapper."""
        bs = fb.padded_size
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:bs].copy_(fb.positions)
        self.out_loc[:bs].copy_(fb.out_loc)
        kind = self.engine.attn_backend.graph_kind(fb)
        if kind == "triton":  # its kernels find each row's KV slots in the page table
            self.token_rows[:bs].copy_(fb.token_rows)
        self.graphs[bs, kind].replay()
        self.last_graph = (bs, kind)
        return self.logits[:bs]
