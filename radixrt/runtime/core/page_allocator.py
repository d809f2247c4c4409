"""Fixed-size page allocator and the owner of the req->slot table's rows. Ids only, no tensors.

Slot of token i in a page list: `page_ids[i // P] * P + i % P`. The tensors these ids index
(the KV pool and the slot table) live in model/kv_cache.py.
"""

from __future__ import annotations

import heapq


class PageAllocator:
    """Alloc/free of page ids from a free min-heap."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        # a min-heap: the lowest free ids go first, in ascending order, so a request's pages tend to
        # be consecutive even after the pool has churned, and the CPU attention reads such a run in
        # place (a shared prefix needs no gather; attention_torch_plan.py). O(log n) per page.
        self._free: list[int] = list(range(num_pages))
        self._is_free = bytearray(b"\x01") * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """n pages, or None (nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = [heapq.heappop(self._free) for _ in range(n)]
        for p in pages:
            self._is_free[p] = 0
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            assert not self._is_free[p], f"page {p} freed twice"
            self._is_free[p] = 1
            heapq.heappush(self._free, p)

    def free_page_set(self) -> set[int]:
        return set(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)


def slots_of(page_ids: list[int], start: int, end: int, page_size: int) -> list[int]:
    """Pool slots of token positions [start, end) of a request holding page_ids."""
    if page_size == 1:
        return page_ids[start:end]
    return [page_ids[i // page_size] * page_size + i % page_size for i in range(start, end)]


class TableRows:
    """The rows of the req->slot table: the scheduler hands one to each running request."""

    def __init__(self, num_rows: int):
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))  # pop() hands out low rows first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("req->slot table is full")
        return self._free.pop()

    def free(self, row: int) -> None:
        assert 0 <= row < self.num_rows and row not in self._free, (
            f"row {row} freed twice or out of range"
        )
        self._free.append(row)

    def free_set(self) -> set[int]:
        return set(self._free)
