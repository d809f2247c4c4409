"""The memory of running requests: their pages, their table rows, and the radix tree they borrow
from.

A running request's first `cached_len` tokens are pages of the tree (locked through `last_node`);
the pages after them it owns. Everything that moves pages between the allocator, the tree and a
request goes through here, so the accounting `check_integrity()` verifies has one author. The
tree knows nothing of requests: it matches, inserts (telling how much was there) and locks; what
that means for a request (its page ids, lengths, lock) is applied here.
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
        """Admission: req borrows `pages` (locked through node, already locked) and gets a table
        row."""
        req.page_ids, req.last_node = list(pages), node
        req.cached_len = req.kv_len = len(pages) * self.page_size
        req.table_row = self.rows.alloc()

    def grow(self, req: Req, num_tokens: int, evict: bool = True) -> bool:
        """Make req's pages cover num_tokens positions, evicting from the tree if needed (and
        allowed)."""
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

    @staticmethod
    def computed(req: Req, kv_len: int) -> None:
        """A forward stored req's KV up to kv_len (its pages were grown for it when planned)."""
        req.kv_len = kv_len

    def trim(self, req: Req) -> None:
        """Give back pages grown for positions past the request's tokens (a draft that was not
        taken)."""
        keep = self.allocator.pages_for(req.seq_len)
        if len(req.page_ids) > keep:
            self.allocator.free(req.page_ids[keep:])
            del req.page_ids[keep:]

    def fork(self, req: Req, donor: Req) -> tuple[int, int]:
        """req forks from donor (admission.fork_donor): it copies the donor's partial last prompt
        page, and the positions before its last prompt token count as computed. (donor's page, req's
        page)."""
        req.kv_len = req.seq_len - 1
        page = req.kv_len // self.page_size
        return donor.page_ids[page], req.page_ids[page]

    def fork_beam(self, child: Req, parent: Req) -> bool:
        """A beam search's child continues from parent, which computed all its tokens and put its
        whole pages into the tree (share): child borrows them (locked again on its behalf), gets a
        row and pages of its own for the rest, filled from parent's by the copies it keeps in
        pending_copies until its first forward (only the partial last page, or every page without
        a tree). False, child holding nothing, when the pool has no room for them."""
        borrowed = parent.cached_len // self.page_size
        child.page_ids, child.last_node = parent.page_ids[:borrowed], parent.last_node
        child.cached_len, child.kv_len = parent.cached_len, parent.kv_len
        if not self.tree.disable:
            self.tree.inc_lock_ref(parent.last_node)
        child.table_row, child.table_stale = self.rows.alloc(), True
        if not self.grow(child, child.kv_len):
            self.drop(child)
            return False
        own = range(borrowed, len(child.page_ids))
        child.pending_copies = [(parent.page_ids[i], child.page_ids[i]) for i in own]
        return True

    def drop(self, req: Req) -> None:
        """req's KV is not wanted any more (a pruned beam): its own pages go back to the allocator
        uncached, its borrowed ones are unlocked, its row is freed."""
        self.allocator.free(req.page_ids[req.cached_len // self.page_size :])
        if not self.tree.disable:
            self.tree.dec_lock_ref(req.last_node)
        req.page_ids, req.kv_len, req.cached_len, req.last_node = [], 0, 0, None
        req.pending_copies = []
        if req.table_row is not None:
            self.rows.free(req.table_row)
            req.table_row = None

    def share(self, req: Req) -> None:
        """Put req's computed whole pages into the tree so waiting requests can match them."""
        self.cache_unfinished(req, req.tree_ids(req.fill_ids[: req.kv_len]))

    def release(self, req: Req) -> None:
        """req stops running (finished or preempted): its KV goes into the tree, its row back."""
        self.cache_finished(req, req.tree_ids(req.fill_ids[: req.kv_len]))
        self.rows.free(req.table_row)
        req.table_row = None

    def cache_unfinished(self, req: Req, token_ids: list[int]) -> None:
        """share, given req's computed tokens: its whole pages go into the tree and it now borrows
        them, its duplicates of pages already there swapped for the tree's (its row is then
        stale)."""
        if self.tree.disable:
            return
        aligned_len = self._insert(req, token_ids)
        num_aligned_pages = aligned_len // self.page_size
        tree_page_ids, new_last = self.tree.match_prefix(token_ids[:aligned_len])
        assert len(tree_page_ids) == num_aligned_pages
        if req.page_ids[:num_aligned_pages] != tree_page_ids:
            req.page_ids[:num_aligned_pages] = tree_page_ids
            req.table_stale = True
        # lock the new path before unlocking the old, so the shared part never looks free
        self.tree.inc_lock_ref(new_last)
        self.tree.dec_lock_ref(req.last_node)
        req.cached_len, req.last_node = aligned_len, new_last

    def cache_finished(self, req: Req, token_ids: list[int]) -> None:
        """release's memory part, given req's computed tokens: its KV goes into the tree, the rest
        of its pages back to the allocator; req ends with no pages and no lock."""
        if self.tree.disable:
            assert req.cached_len == 0
            self.allocator.free(req.page_ids)
        else:
            aligned_len = self._insert(req, token_ids)
            self.allocator.free(req.page_ids[aligned_len // self.page_size :])  # partial and unused
            self.tree.dec_lock_ref(req.last_node)
        req.page_ids, req.kv_len, req.cached_len, req.last_node = [], 0, 0, None

    def _insert(self, req: Req, token_ids: list[int]) -> int:
        """Insert req's whole pages into the tree and free those duplicating pages already cached;
        returns the tokens those pages cover."""
        if len(token_ids) != req.kv_len:
            raise ValueError(
                f"token_ids has {len(token_ids)} tokens, req {req.rid} holds KV of {req.kv_len}"
            )
        assert req.cached_len % self.page_size == 0, "borrowed prefix must be whole pages"
        aligned_len = req.kv_len - req.kv_len % self.page_size
        num_aligned_pages = aligned_len // self.page_size
        assert len(req.page_ids) >= num_aligned_pages, "req holds fewer pages than its kv_len needs"
        prefix_len = self.tree.insert(token_ids[:aligned_len], req.page_ids[:num_aligned_pages])
        # the borrowed prefix is still locked, so it is found again
        assert prefix_len >= req.cached_len
        self.allocator.free(
            req.page_ids[req.cached_len // self.page_size : prefix_len // self.page_size]
        )
        return aligned_len

    @staticmethod
    def table_write_start(req: Req) -> int:
        """First position whose slot goes into the req's table row this step: all of them when the
        row is stale (a new row, pages swapped for the tree's, a failed step), else the new
        positions."""
        return 0 if req.table_stale else req.kv_len

    @staticmethod
    def row_planned(req: Req) -> None:
        """The step being planned rewrites req's whole row (a failed step marks it stale again)."""
        req.table_stale = False
