"""The KV pages of admitted requests, after the prefill manager gave them out: one more page
whenever a running request's next token needs it (preempting the newest request when none is
free), every page back when a request ends or is preempted, and the memory of free pages back to
the OS while the scheduler is idle."""

from __future__ import annotations

import logging

from ..engine import Engine
from ..kvcache import CacheManager
from ..model_loader import return_freed_memory
from ..request import Req
from .decode import DecodeManager
from .prefill import PrefillManager

logger = logging.getLogger(__name__)


class KVMemory:
    def __init__(
        self,
        engine: Engine,
        cache_manager: CacheManager,
        prefill_manager: PrefillManager,
        decode_manager: DecodeManager,
    ) -> None:
        self.engine = engine
        self.page_size = engine.page_size
        self.cache_manager = cache_manager
        self.prefill_manager = prefill_manager
        self.decode_manager = decode_manager

    def release(self, req: Req) -> None:
        """Give back an admitted request's table row and pages: those whose KV is computed go to
        the cache manager (the radix tree keeps them for later prompts), the prefix it read is
        unlocked."""
        match = self.prefill_manager.matches.pop(req.uid, None)
        self.cache_manager.release(req.token_ids, req.cached_len, req.pages, match)
        self.engine.page_table.free_row(req.table_slot)
        req.table_slot, req.pages = -1, []

    def preempt(self, req: Req) -> None:
        """Out of KV pages while decoding: send ``req`` back to the queue; it will recompute its
        prompt and the tokens generated so far when pages are free again."""
        self.release(req)
        req.cached_len = 0
        self.decode_manager.remove(req)
        self.prefill_manager.add(req, front=True)
        logger.debug("preempted request %d (KV cache full)", req.uid)

    def grow_decode_pages(self) -> None:
        """Every running request needs a slot for the token it is about to compute."""
        for req in list(self.decode_manager.running.values()):
            if req.uid not in self.decode_manager.running or req.output_len >= req.max_new_tokens:
                continue  # preempted below to make room, or nothing left to compute
            while len(req.pages) * self.page_size <= req.cached_len:
                pages = self.cache_manager.alloc_pages(1)
                if pages is not None:
                    self.engine.page_table.write_pages(req.table_slot, len(req.pages), pages)
                    req.pages.extend(pages)
                    continue
                victim = self.decode_manager.newest()
                self.preempt(victim)
                if victim is req:
                    break

    def release_idle(self, evict_cache: bool) -> int:
        """Give the memory of free KV pages (and, with ``evict_cache``, of the prefix cache's)
        back to the OS, with the C allocator's freed buffers. Returns the KV bytes released; 0
        for a pool that keeps its memory (a GPU's)."""
        pool = self.engine.kv_pool
        if not pool.releasable:
            return 0
        if evict_cache:
            self.cache_manager.evict_unused()
        released = pool.release(self.cache_manager.allocator.free_runs())
        return_freed_memory()
        logger.debug("idle: %d MB of free KV pages released", released >> 20)
        return released
