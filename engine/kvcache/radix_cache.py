"""The radix prefix cache: finished requests leave their computed KV in a tree keyed by token ids,
so a later prompt that starts the same way (a system prompt, the earlier turns of a chat) skips
recomputing it.

Keys are cut at page boundaries: every node holds a whole number of pages, and a child is found
by its first page of tokens. A partial page is never cached, so a page in the tree always holds
exactly the KV of its ``page_size`` tokens at its position.

Each page has one owner at a time: the allocator (free), one live request (pages it computed
itself), or the tree. Live requests that reuse a prefix *lock* the tree nodes on its path (a
refcount up to the root); unlocked nodes are evictable and counted as ``cached``, locked ones as
``used``. When the pool runs short, unlocked leaves go back to the allocator, least recently
used first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from .cache_manager import CacheManager, KVStats, PrefixMatch
from .page_allocator import PageAllocator


class RadixNode:
    """A run of tokens (a multiple of page_size) and the pages holding their KV."""

    __slots__ = ("key", "pages", "parent", "children", "ref", "last_access")

    def __init__(
        self, key: list[int], pages: list[int], parent: RadixNode | None, last_access: int = 0
    ) -> None:
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}  # first page of tokens -> child
        self.ref = 0  # live requests whose matched prefix runs through this node
        self.last_access = last_access

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCacheManager(CacheManager):
    def __init__(self, allocator: PageAllocator, page_size: int) -> None:
        super().__init__(allocator, page_size)
        self.root = RadixNode([], [], None)
        self.root.ref = 1  # never evicted, never counted
        self._clock = itertools.count(1)
        self.evictable_pages = 0  # pages in unlocked nodes

    # ---- the CacheManager interface ----------------------------------------------------------

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """The longest cached prefix, locked. The last prompt token is never matched: its
        forward pass is what produces the logits of the first new token."""
        limit = (len(token_ids) - 1) // self.page_size * self.page_size
        node, length = self._walk(token_ids[:limit])
        if node is self.root:
            return PrefixMatch(pages=[], length=0)
        self._lock(node)
        return PrefixMatch(pages=self._path_pages(node), length=length, handle=node)

    def alloc_pages(self, n: int) -> list[int] | None:
        if n > self.available_pages():
            return None
        short = n - self.allocator.num_free
        if short > 0:
            self.evict(short)
        return self.allocator.alloc(n)

    def release(
        self, token_ids: list[int], cached_len: int, pages: list[int], match: PrefixMatch | None
    ) -> None:
        """Insert the request's whole computed pages, free the rest, then unlock its prefix."""
        matched = match.pages if match is not None else []
        keep = min(cached_len // self.page_size, len(pages))
        if pages:
            assert keep >= len(matched) and pages[: len(matched)] == matched, (
                "a request lost its cached prefix"
            )
            duplicates = self._insert(token_ids[: keep * self.page_size], pages[:keep])
            self.allocator.free(duplicates + pages[keep:])
        if match is not None and match.handle is not None:
            self._unlock(match.handle)

    def available_pages(self) -> int:
        return self.allocator.num_free + self.evictable_pages

    def stats(self) -> KVStats:
        total, free, cached = (
            self.allocator.num_pages,
            self.allocator.num_free,
            self.evictable_pages,
        )
        return KVStats(total=total, used=total - free - cached, cached=cached, free=free)

    # ---- eviction ----------------------------------------------------------------------------

    def evict_unused(self) -> int:
        return self.evict(self.evictable_pages)

    def evict(self, n: int) -> int:
        """Give at least ``n`` pages back to the allocator (fewer if not that many are
        evictable), removing unlocked leaves least recently used first. Returns pages freed."""
        leaves = [
            (node.last_access, id(node), node)
            for node in self.nodes()
            if node.is_leaf and node.ref == 0
        ]
        heapq.heapify(leaves)
        freed = 0
        while freed < n and leaves:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            del parent.children[self._first_page(node.key)]
            self.allocator.free(node.pages)
            freed += len(node.pages)
            self.evictable_pages -= len(node.pages)
            if parent is not self.root and parent.is_leaf and parent.ref == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return freed

    # ---- the tree ----------------------------------------------------------------------------

    def nodes(self) -> Iterator[RadixNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _first_page(self, key: list[int], start: int = 0) -> tuple[int, ...]:
        return tuple(key[start : start + self.page_size])

    def _walk(self, key: list[int]) -> tuple[RadixNode, int]:
        """Follow ``key`` (page-aligned) down from the root as far as the tree has it; returns
        the deepest node reached and the length matched. A node matched only in part is split,
        so that the match ends on a node boundary (and a lock covers exactly the match)."""
        node, pos, now = self.root, 0, next(self._clock)
        while pos < len(key):
            child = node.children.get(self._first_page(key, pos))
            if child is None:
                break
            common = self._common_len(child.key, key, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now
            node, pos = child, pos + common
        return node, pos

    def _common_len(self, node_key: list[int], key: list[int], start: int) -> int:
        """Length of the common page-aligned prefix of ``node_key`` and ``key[start:]``."""
        ps = self.page_size
        n = min(len(node_key), len(key) - start) // ps * ps
        i = ps  # the first page matched already (it is how the child was found)
        while i < n and node_key[i : i + ps] == key[start + i : start + i + ps]:
            i += ps
        return min(i, n)

    def _split(self, node: RadixNode, length: int) -> RadixNode:
        """Cut ``node`` after ``length`` tokens; the new upper part is returned. Locks that run
        through ``node`` run through its new parent too, so the parent takes the same refcount;
        the lower part keeps its identity (a lock handle stays valid)."""
        n_pages = length // self.page_size
        upper = RadixNode(node.key[:length], node.pages[:n_pages], node.parent, node.last_access)
        upper.ref = node.ref
        node.parent.children[self._first_page(upper.key)] = upper
        node.key, node.pages, node.parent = node.key[length:], node.pages[n_pages:], upper
        upper.children[self._first_page(node.key)] = node
        return upper

    def _insert(self, key: list[int], pages: list[int]) -> list[int]:
        """Add ``key`` with its ``pages`` (one per page of tokens). Returns the given pages the
        tree did not take because it already holds the same prefix: the caller frees them."""
        ps = self.page_size
        node, pos = self._walk(key)
        duplicates = [
            p for p, owned in zip(pages[: pos // ps], self._path_pages(node)) if p != owned
        ]
        if pos < len(key):
            leaf = RadixNode(key[pos:], pages[pos // ps :], node, next(self._clock))
            node.children[self._first_page(leaf.key)] = leaf
            self.evictable_pages += len(leaf.pages)
        return duplicates

    def _path_pages(self, node: RadixNode) -> list[int]:
        runs = []
        while node is not self.root:
            runs.append(node.pages)
            node = node.parent
        return [p for run in reversed(runs) for p in run]

    def _lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.ref == 0:
                self.evictable_pages -= len(node.pages)
            node.ref += 1
            node = node.parent

    def _unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.ref -= 1
            assert node.ref >= 0, "radix node unlocked more often than locked"
            if node.ref == 0:
                self.evictable_pages += len(node.pages)
            node = node.parent
