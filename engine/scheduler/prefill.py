"""The waiting queue: admits requests when a page-table row and their prompt's KV pages are
free, and cuts the next prefill batch to the token budget (chunking a long prompt)."""

from __future__ import annotations

from collections import deque

from ..batch import Batch
from ..kvcache import CacheManager, PageTable, PrefixMatch
from ..request import Req

PROMPT_LOGPROB_CHUNK = 1024
"""Prompt tokens a request that asks for prompt logprobs computes per step: each one's logits
over the whole vocabulary are kept for the step (1024 x 151,936 float32 is 0.6 GB)."""


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class PrefillManager:
    def __init__(
        self,
        cache_manager: CacheManager,
        page_table: PageTable,
        page_size: int,
        max_prefill_tokens: int,
        first_chunk_tokens: int | None = None,
    ) -> None:
        """``first_chunk_tokens``: a prompt longer than one chunk starts with at most this many
        tokens (None: a full chunk), so its progress moves early (engine.FIRST_PREFILL_CHUNK_CPU)."""
        self.cache_manager = cache_manager
        self.page_table = page_table
        self.page_size = page_size
        self.max_prefill_tokens = max_prefill_tokens
        self.first_chunk_tokens = first_chunk_tokens or max_prefill_tokens
        self.waiting: deque[Req] = deque()
        self.matches: dict[int, PrefixMatch] = {}  # uid -> locked prefix of an admitted request
        self.prefix_hit_tokens = 0  # prompt tokens admitted requests found cached (not recomputed)

    def add(self, req: Req, front: bool = False) -> None:
        (self.waiting.appendleft if front else self.waiting.append)(req)

    def remove(self, req: Req) -> None:
        self.waiting.remove(req)

    def _admit(self, req: Req) -> bool:
        """Give ``req`` a page-table row and KV pages for its whole sequence, or leave it waiting."""
        if self.page_table.num_free_rows == 0:
            return False
        match = (
            self.cache_manager.match_prefix(req.token_ids)
            if req.use_prefix_cache
            else PrefixMatch([], 0)
        )
        need = pages_for(req.seq_len, self.page_size) - len(match.pages)
        new_pages = self.cache_manager.alloc_pages(need) if need > 0 else []
        if new_pages is None:
            self.cache_manager.release([], 0, [], match)  # unlock the prefix again
            return False
        req.table_slot = self.page_table.alloc_row()
        req.pages = match.pages + new_pages
        req.cached_len = match.length
        self.matches[req.uid] = match
        self.prefix_hit_tokens += match.length
        self.page_table.write_pages(req.table_slot, 0, req.pages)
        return True

    def schedule(self, max_new_requests: int) -> Batch | None:
        """The next prefill batch within the token budget, or None if nothing can start.

        A request only partly computed (chunked) stays at the head of the queue and continues
        first in the next prefill batch.
        """
        budget = self.max_prefill_tokens
        reqs: list[Req] = []
        extend_lens: list[int] = []
        for req in list(self.waiting):
            if budget <= 0:
                break
            first_chunk = req.table_slot < 0  # admitted now: none of its prompt computed yet
            if first_chunk:
                if max_new_requests <= 0 or not self._admit(req):
                    break
                max_new_requests -= 1
            extend = min(
                req.extend_len, budget, PROMPT_LOGPROB_CHUNK if req.scores_prompt else budget
            )
            if first_chunk and req.extend_len > self.max_prefill_tokens:
                extend = min(extend, self.first_chunk_tokens)
            reqs.append(req)
            extend_lens.append(extend)
            budget -= extend
            if extend < req.extend_len:
                break  # chunked: the rest of this prompt goes in a later batch
            self.waiting.popleft()
        return Batch("prefill", reqs, extend_lens) if reqs else None
