"""The memory of running requests: their pages, their table rows, and the radix tree they borrow
from.

A running request's first `kv.borrowed_len` tokens are pages of the tree (locked through
`kv.last_node`); the pages after them it owns. Everything that moves pages between the allocator,
the tree (its second tier included) and a request goes through here, so the accounting
`check_integrity()` verifies has one author. The
tree knows nothing of requests: it matches, inserts (telling how much was there) and locks; what
that means for a request (its page ids, lengths, lock) is applied here.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.core import schedule_policy as policy
from radixrt.runtime.core.page_allocator import PageAllocator, TableRows
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.tree_node import TreeNode


@dataclass
class PrefixMatch:
    """A waiting request's cached prefix: pool pages ending at `node`, then nodes only in the
    tier."""

    pages: list[int]
    node: TreeNode
    in_tier: list[TreeNode]
    page_size: int

    @property
    def matched_len(self) -> int:
        """Tokens the match supplies, the tier's included."""
        return (len(self.pages) + sum(len(n.host_value) for n in self.in_tier)) * self.page_size


class ReqMemory:
    def __init__(self, allocator: PageAllocator, tree: RadixCache, rows: TableRows):
        self.allocator = allocator
        self.tree = tree
        self.rows = rows
        self.page_size = allocator.page_size

    def admit(self, req: Req, match: PrefixMatch, budget: int, reserve: int) -> int | None:
        """Admission's memory in one call: lock the match, check that its pages up to `budget`
        tokens past it (the tier's to load back included) and `reserve` decode tokens fit in free +
        evictable memory, load the tier part back, then req borrows the match, gets a table row and
        pages. Returns the step budget left after loading from the tier (its copy costs budget:
        policy.TIER_LOAD_TOKENS_PER_BUDGET_TOKEN); None, nothing held, when it does not fit."""
        target = min(req.seq_len, match.matched_len + budget)
        self.tree.inc_lock_ref(match.node)
        need = self.allocator.pages_for(target) - len(match.pages)
        room = self.allocator.num_free + self.tree.evictable_pages
        if need + self.allocator.pages_for(reserve) > room:
            self.tree.dec_lock_ref(match.node)
            return None
        if match.in_tier:
            budget = self._load_back(match, budget)
        req.kv.page_ids, req.kv.last_node = list(match.pages), match.node
        req.kv.borrowed_len = req.kv.computed_len = len(match.pages) * self.page_size
        req.kv.table_row = self.rows.alloc()
        if not self.grow(req, min(req.seq_len, match.matched_len + budget)):
            raise AssertionError("admission accounting is wrong")  # counted above
        return budget

    def _load_back(self, match: PrefixMatch, budget: int) -> int:
        """Copy the match's tier-only nodes back into the pool (one batched copy); the lock moves to
        the last node loaded. Returns the step's budget less the copy."""
        loaded, last = self.tree.load_back(match.in_tier)
        match.in_tier = []
        if last is None:  # nothing came back (a corrupt first page): recompute it
            return budget
        self.tree.inc_lock_ref(last)  # lock the longer path before unlocking the old one
        self.tree.dec_lock_ref(match.node)
        match.pages, match.node = match.pages + loaded, last
        cost = len(loaded) * match.page_size // policy.TIER_LOAD_TOKENS_PER_BUDGET_TOKEN
        return max(budget - cost, 1)

    def grow(self, req: Req, num_tokens: int, evict: bool = True) -> bool:
        """Make req's pages cover num_tokens positions, evicting from the tree if needed (and
        allowed)."""
        need = self.allocator.pages_for(num_tokens) - len(req.kv.page_ids)
        if need <= 0:
            return True
        if self.allocator.num_free < need and evict:
            self.tree.evict(need - self.allocator.num_free)
        pages = self.allocator.alloc(need)
        if pages is None:
            return False
        req.kv.page_ids.extend(pages)
        return True

    @staticmethod
    def computed(req: Req, computed_len: int) -> None:
        """A forward stored req's KV up to computed_len (its pages were grown for it when
        planned)."""
        req.kv.computed_len = computed_len

    def trim(self, req: Req) -> None:
        """Give back pages grown for positions past the request's tokens (a draft that was not
        taken)."""
        keep = self.allocator.pages_for(req.seq_len)
        if len(req.kv.page_ids) > keep:
            self.allocator.free(req.kv.page_ids[keep:])
            del req.kv.page_ids[keep:]

    def fork(self, req: Req, donor: Req) -> tuple[int, int]:
        """req forks from donor (admission.fork_donor): it copies the donor's partial last prompt
        page, and the positions before its last prompt token count as computed. (donor's page, req's
        page)."""
        req.kv.computed_len = req.seq_len - 1
        page = req.kv.computed_len // self.page_size
        return donor.kv.page_ids[page], req.kv.page_ids[page]

    def fork_beam(self, child: Req, parent: Req) -> bool:
        """A beam search's child continues from parent, which computed all its tokens and put its
        whole pages into the tree (share): child borrows them (locked again on its behalf), gets a
        row and pages of its own for the rest, filled from parent's by the copies it keeps in
        pending_copies until its first forward (only the partial last page, or every page without
        a tree). False, child holding nothing, when the pool has no room for them."""
        borrowed = parent.kv.borrowed_len // self.page_size
        child.kv.page_ids, child.kv.last_node = parent.kv.page_ids[:borrowed], parent.kv.last_node
        child.kv.borrowed_len, child.kv.computed_len = (
            parent.kv.borrowed_len,
            parent.kv.computed_len,
        )
        self.tree.inc_lock_ref(parent.kv.last_node)  # (a disabled tree's root: no lock)
        child.kv.table_row, child.kv.table_stale = self.rows.alloc(), True
        if not self.grow(child, child.kv.computed_len):
            self.drop(child)
            return False
        own = range(borrowed, len(child.kv.page_ids))
        child.kv.pending_copies = [(parent.kv.page_ids[i], child.kv.page_ids[i]) for i in own]
        return True

    def drop(self, req: Req) -> None:
        """req's KV is not wanted any more (a pruned beam): its own pages go back to the allocator
        uncached, its borrowed ones are unlocked, its row is freed."""
        self.allocator.free(req.kv.page_ids[req.kv.borrowed_len // self.page_size :])
        self.tree.dec_lock_ref(req.kv.last_node)
        req.kv.page_ids, req.kv.computed_len, req.kv.borrowed_len, req.kv.last_node = [], 0, 0, None
        req.kv.pending_copies = []
        if req.kv.table_row is not None:
            self.rows.free(req.kv.table_row)
            req.kv.table_row = None

    def share(self, req: Req) -> None:
        """Put req's computed whole pages into the tree so waiting requests can match them."""
        self.cache_unfinished(req, req.tree_ids(req.fill_ids[: req.kv.computed_len]))

    def release(self, req: Req) -> None:
        """req stops running (finished or preempted): its KV goes into the tree, its row back."""
        self.cache_finished(req, req.tree_ids(req.fill_ids[: req.kv.computed_len]))
        self.rows.free(req.kv.table_row)
        req.kv.table_row = None

    def cache_unfinished(self, req: Req, token_ids: list[int]) -> None:
        """share, given req's computed tokens: its whole pages go into the tree and it now borrows
        them, its duplicates of pages already there swapped for the tree's (its row is then
        stale)."""
        if self.tree.disable:  # a disabled tree keeps nothing, so it has nothing to lend back
            return
        aligned_len = self._insert(req, token_ids)
        num_aligned_pages = aligned_len // self.page_size
        tree_page_ids, new_last = self.tree.match_prefix(token_ids[:aligned_len])
        assert len(tree_page_ids) == num_aligned_pages
        if req.kv.page_ids[:num_aligned_pages] != tree_page_ids:
            req.kv.page_ids[:num_aligned_pages] = tree_page_ids
            req.kv.table_stale = True
        # lock the new path before unlocking the old, so the shared part never looks free
        self.tree.inc_lock_ref(new_last)
        self.tree.dec_lock_ref(req.kv.last_node)
        req.kv.borrowed_len, req.kv.last_node = aligned_len, new_last

    def cache_finished(self, req: Req, token_ids: list[int]) -> None:
        """release's memory part, given req's computed tokens: its KV goes into the tree, the rest
        of its pages back to the allocator; req ends with no pages and no lock."""
        # (a disabled tree adopts nothing: its insert says every token was there, so _insert frees
        # every whole page as a duplicate)
        aligned_len = self._insert(req, token_ids)
        self.allocator.free(req.kv.page_ids[aligned_len // self.page_size :])  # partial, unused
        self.tree.dec_lock_ref(req.kv.last_node)
        req.kv.page_ids, req.kv.computed_len, req.kv.borrowed_len, req.kv.last_node = [], 0, 0, None

    def _insert(self, req: Req, token_ids: list[int]) -> int:
        """Insert req's whole pages into the tree and free those duplicating pages already cached;
        returns the tokens those pages cover."""
        if len(token_ids) != req.kv.computed_len:
            raise ValueError(
                f"token_ids has {len(token_ids)} tokens, req {req.rid} holds KV of "
                f"{req.kv.computed_len}"
            )
        assert req.kv.borrowed_len % self.page_size == 0, "borrowed prefix must be whole pages"
        aligned_len = req.kv.computed_len - req.kv.computed_len % self.page_size
        num_aligned_pages = aligned_len // self.page_size
        assert len(req.kv.page_ids) >= num_aligned_pages, (
            "req holds fewer pages than its computed_len needs"
        )
        prefix_len = self.tree.insert(token_ids[:aligned_len], req.kv.page_ids[:num_aligned_pages])
        # the borrowed prefix is still locked, so it is found again
        assert prefix_len >= req.kv.borrowed_len
        self.allocator.free(
            req.kv.page_ids[req.kv.borrowed_len // self.page_size : prefix_len // self.page_size]
        )
        return aligned_len

    @staticmethod
    def table_write_start(req: Req) -> int:
        """First position whose slot goes into the req's table row this step: all of them when the
        row is stale (a new row, pages swapped for the tree's, a failed step), else the new
        positions."""
        return 0 if req.kv.table_stale else req.kv.computed_len

    @staticmethod
    def row_planned(req: Req) -> None:
        """The step being planned rewrites req's whole row (a failed step marks it stale again)."""
        req.kv.table_stale = False
