"""The memory of running requests: their pages, their table rows, and the radix tree they borrow from.

A running request's first `cached_len` tokens are pages of the tree (locked through `last_node`);
the pages after them it owns. Everything that moves pages between the allocator, the tree and a
request goes through here, so the accounting `check_integrity()` verifies has one author.
"""

from __future__ import annotations

from radixrt.runtime.core.page_allocator import PageAllocator, TableRows
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req


class ReqMemory:
    def __init__(self, allocator: PageAllocator, tree: RadixCache, rows: TableRows):
        self.allocator = allocator
        self.tree = tree
        self.rows = rows
        self.page_size = allocator.page_size

    def take(self, req: Req, pages: list[int], node: object) -> None:
        """Admission: req borrows `pages` (locked through node, already locked) and gets a table row."""
        req.page_ids, req.last_node = list(pages), node
        req.cached_len = req.kv_len = len(pages) * self.page_size
        req.table_row = self.rows.alloc()

    def grow(self, req: Req, num_tokens: int, evict: bool = True) -> bool:
        """Make req's pages cover num_tokens positions, evicting from the tree if needed (and allowed)."""
        need = self.allocator.pages_for(num_tokens) - len(req.page_ids)
        if need <= 0:
            return True
        if self.allocator.num_free < need and evict:
            self.tree.evict(need - self.allocator.num_free)
        pages = self.allocator.alloc(need)
        if pages is None:
            return False
        req.page_ids.extend(pages)
        return True

    def trim(self, req: Req) -> None:
        """Give back pages grown for positions past the request's tokens (a draft that was not taken)."""
        keep = self.allocator.pages_for(req.seq_len)
        if len(req.page_ids) > keep:
            self.allocator.free(req.page_ids[keep:])
            del req.page_ids[keep:]

    def share(self, req: Req) -> None:
        """Put req's computed whole pages into the tree so waiting requests can match them."""
        before = req.page_ids[:]
        self.tree.cache_unfinished_req(req, req.fill_ids[: req.kv_len])
        if req.page_ids != before:  # our duplicates were swapped for the tree's pages
            req.table_stale = True

    def release(self, req: Req) -> None:
        """req stops running (finished or preempted): its KV goes into the tree, its row back."""
        self.tree.cache_finished_req(req, req.fill_ids[: req.kv_len])
        self.rows.free(req.table_row)
        req.table_row = None

    @staticmethod
    def table_write_start(req: Req) -> int:
        """First position whose slot goes into the req's table row this step: all of them when the row
        is stale (a new row, pages swapped for the tree's, a failed step), else the new positions."""
        return 0 if req.table_stale else req.kv_len

    @staticmethod
    def row_planned(req: Req) -> None:
        """The step being planned rewrites req's whole row (a failed step marks it stale again)."""
        req.table_stale = False
