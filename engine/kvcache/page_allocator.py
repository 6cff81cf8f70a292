"""Hands out KV pages and takes them back; a page can never have two owners."""

from __future__ import annotations

import numpy


class PageAllocator:
    """A free list with an in-use mark per page, so a double allocation or double free is caught
    at once instead of silently corrupting another request's KV."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() gives low pages first
        self._in_use = bytearray(num_pages)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV pages, {len(self._free)} free")
        if n == 0:
            return []
        # the last n of the free list, lowest page first (one slice, not n pops: a prefill step
        # takes ~8,192 pages at once)
        pages = self._free[-n:]
        pages.reverse()
        in_use = self._in_use
        for p in pages:
            assert not in_use[p], f"page {p} handed out twice"
            in_use[p] = 1
        del self._free[-n:]
        return pages

    def free(self, pages: list[int]) -> None:
        # check everything before changing anything, so a bad call loses no page
        if len(set(pages)) != len(pages):
            raise AssertionError(f"the same page freed twice in one call: {sorted(pages)}")
        in_use, num_pages = self._in_use, self.num_pages
        for p in pages:
            if not 0 <= p < num_pages or not in_use[p]:
                raise AssertionError(f"page {p} freed while not in use")
        for p in pages:
            in_use[p] = 0
        self._free.extend(reversed(pages))

    def free_runs(self) -> list[tuple[int, int]]:
        """The free pages as runs [start, end), lowest first."""
        marks = numpy.concatenate(
            ([1], numpy.frombuffer(self._in_use, dtype=numpy.uint8), [1])
        ).astype(numpy.int8)
        steps = numpy.diff(marks)  # -1 where a free run starts, +1 just past its end
        return list(
            zip(numpy.flatnonzero(steps == -1).tolist(), numpy.flatnonzero(steps == 1).tolist())
        )
