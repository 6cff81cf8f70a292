"""The cache-manager interface between the scheduler and the KV pages.

The scheduler never touches the allocator directly: it asks the cache manager for a request's
cached prefix, for new pages, and hands every finished request back through ``release``. The
naive manager caches nothing; the radix prefix cache (radix_cache.py) implements the same
interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from .page_allocator import PageAllocator


@dataclass(frozen=True)
class KVStats:
    """Page counts; ``used + cached + free == total`` at every step."""

    total: int
    used: int  # held by live requests
    cached: int  # held only by the prefix cache (evictable)
    free: int


@dataclass
class PrefixMatch:
    """The longest cached prefix of a prompt: its pages and length (a multiple of page_size)."""

    pages: list[int]
    length: int
    handle: object = None  # manager-specific lock handle


class CacheManager(ABC):
    def __init__(self, allocator: PageAllocator, page_size: int) -> None:
        self.allocator = allocator
        self.page_size = page_size

    @abstractmethod
    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Find cached KV for a prefix of ``token_ids`` and lock it for the caller."""

    @abstractmethod
    def alloc_pages(self, n: int) -> list[int] | None:
        """``n`` fresh pages for a live request, evicting if needed; None if impossible."""

    @abstractmethod
    def release(
        self, token_ids: list[int], cached_len: int, pages: list[int], match: PrefixMatch | None
    ) -> None:
        """Take back a request's pages when it ends in any way. ``token_ids[:cached_len]`` have
        KV that was fully computed; a cache may keep those, the rest is freed."""

    @abstractmethod
    def available_pages(self) -> int:
        """Pages a new allocation could obtain (free plus evictable)."""

    @abstractmethod
    def stats(self) -> KVStats: ...

    def evict_unused(self) -> int:
        """Free every page that no live request holds; returns how many (none: nothing cached)."""
        return 0


class NaiveCacheManager(CacheManager):
    """No prefix sharing: every request computes its whole prompt, every page goes back free."""

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        return PrefixMatch(pages=[], length=0)

    def alloc_pages(self, n: int) -> list[int] | None:
        if n > self.allocator.num_free:
            return None
        return self.allocator.alloc(n)

    def release(
        self, token_ids: list[int], cached_len: int, pages: list[int], match: PrefixMatch | None
    ) -> None:
        self.allocator.free(pages)

    def available_pages(self) -> int:
        return self.allocator.num_free

    def stats(self) -> KVStats:
        free = self.allocator.num_free
        total = self.allocator.num_pages
        return KVStats(total=total, used=total - free, cached=0, free=free)
