"""Fixed-size page allocator, the req->slot table, and the per-layer KV tensors.

The allocator deals in page ids only (the scheduler and radix cache use it without
touching tensors). Slot of token i in a page list: `page_ids[i // P] * P + i % P`.
"""
from __future__ import annotations

import torch


class PageAllocator:
    """O(1) alloc/free of page ids from a free list."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
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
        pages = self._free[-n:]
        del self._free[-n:]
        for p in pages:
            self._is_free[p] = 0
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            assert not self._is_free[p], f"page {p} freed twice"
            self._is_free[p] = 1
        self._free.extend(pages)

    def free_page_set(self) -> set[int]:
        return set(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)


def slots_of(page_ids: list[int], start: int, end: int, page_size: int) -> list[int]:
    """Pool slots of token positions [start, end) of a request holding page_ids."""
    if page_size == 1:
        return page_ids[start:end]
    return [page_ids[i // page_size] * page_size + i % page_size for i in range(start, end)]


class ReqToSlotTable:
    """Row r, column i: the pool slot of token i of the request holding row r.

    Lets attention gather a whole batch's KV indices with one indexing op instead of
    rebuilding Python lists of every slot every step.
    """

    def __init__(self, max_rows: int, max_context: int, device: torch.device | str = "cpu"):
        self.table = torch.zeros((max_rows, max_context), dtype=torch.int64, device=device)
        self.max_context = max_context
        self._free_rows = list(range(max_rows - 1, -1, -1))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise RuntimeError("req->slot table is full")
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)


class KVCache:
    """K and V per layer: [num_slots, num_kv_heads, head_dim] each."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
