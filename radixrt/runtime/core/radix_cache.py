"""Token-keyed radix tree over KV pages: match, insert, lock, LRU leaf eviction.

An edge is a run of token ids whose length is a multiple of page_size; its node holds the page ids
of that run (one per page), so the tree only ever shares whole pages: a partially filled page is
private to the request that writes it. Requests borrow a path read-only and pin it with a lock; only
unlocked leaves are evicted, least recently used first. No tensors here: ints and lists only, so
this is tested without a model. With a second cache tier (tiered_cache.py, a subclass) a node may
hold its KV only there (`value` None): match_prefix stops before such a node, insert gives it the
caller's pages, eviction calls the _evict_node / _evicted hooks.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, Callable, Iterator

from radixrt.runtime.core.page_allocator import PageAllocator
from radixrt.runtime.core.token_prefix import common_prefix_len
from radixrt.runtime.core.tree_node import TreeNode


def _in_pool(node: TreeNode) -> bool:
    return node.value is not None


def _any_node(node: TreeNode) -> bool:
    return True


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int, disable: bool = False):
        if page_size != allocator.page_size:
            raise ValueError(f"page_size {page_size} != allocator page_size {allocator.page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.root = TreeNode([], [], None)
        self.evictable_pages = 0  # pages in the tree on unlocked nodes
        self.protected_pages = 0  # pages in the tree on locked nodes
        self._clock = 0  # bumped once per match/insert: LRU order without wall time
        self._now = 0.0  # time.time() of that match/insert (for the cache view)

    # ---- lookup and insertion ------------------------------------------------------

    def _child_key(self, token_ids: list[int], start: int = 0) -> Any:
        if self.page_size == 1:
            return token_ids[start]
        return tuple(token_ids[start : start + self.page_size])

    def _match_len(self, key: list[int], token_ids: list[int], start: int) -> int:
        """Tokens of key equal to token_ids[start:], rounded down to whole pages."""
        i = common_prefix_len(key, token_ids[start : start + len(key)])
        return i - i % self.page_size

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut child's edge after split_len tokens; return the new upper node."""
        assert 0 < split_len < len(child.key) and split_len % self.page_size == 0
        num_pages = split_len // self.page_size
        upper = TreeNode(
            child.key[:split_len],
            None if child.value is None else child.value[:num_pages],
            child.parent,
        )
        if child.host_value is not None:
            upper.host_value = child.host_value[:num_pages]
            child.host_value = child.host_value[num_pages:]
        # same lock and age as before the cut, so counts and LRU order do not change
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.last_access_time = child.last_access_time
        upper.hits = child.hits  # every match through the whole child ran through its first part
        child.parent.children[self._child_key(upper.key)] = upper
        child.key = child.key[split_len:]
        if child.value is not None:
            child.value = child.value[num_pages:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _walk(
        self,
        token_ids: list[int],
        end: int,
        node: TreeNode,
        pos: int,
        enter: Callable[[TreeNode], bool],
    ) -> Iterator[TreeNode]:
        """The one descent of match_prefix, match_tier and insert: follow token_ids[pos:end] (whole
        pages) down from node, `pos` tokens deep. Each child that `enter(child)` accepts has its
        edge split where the match ends inside it (so the node yielded ends exactly at the match),
        is stamped for LRU, and is yielded; the walk stops before a missing or refused child. The
        caller counts positions: each yielded node covers len(node.key) tokens."""
        self._clock += 1
        self._now = time.time()
        while pos < end:
            child = node.children.get(self._child_key(token_ids, pos))
            if child is None or not enter(child):
                return
            match_len = self._match_len(child.key, token_ids, pos)
            assert match_len > 0, "child keyed by its first page must match that page"
            if match_len < len(child.key):
                child = self._split(child, match_len)
            self._touch(child)
            yield child
            node, pos = child, pos + match_len

    def _touch(self, node: TreeNode) -> None:
        node.last_access, node.last_access_time = self._clock, self._now

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], TreeNode]:
        """Pages of the longest cached whole-page prefix of token_ids, and its last node.

        Splits an edge where the match ends inside it, so the returned node ends exactly
        at the match and can be locked without pinning tokens the caller does not use.
        """
        if self.disable:
            return [], self.root
        page_ids: list[int] = []
        node = self.root
        aligned_len = len(token_ids) - len(token_ids) % self.page_size
        # a node only in the second tier ends the pool's match: tiered_cache.match_tier goes on
        for node in self._walk(token_ids, aligned_len, self.root, 0, _in_pool):
            page_ids.extend(node.value)
        return page_ids, node

    def match_tier(self, token_ids: list[int], node: TreeNode, pos: int) -> list[TreeNode]:
        """Nodes only in a second tier that continue a match (tiered_cache.py); none without one."""
        return []

    def tier_info(self) -> dict[str, Any]:
        """The second tier's figures for server_info (tiered_cache.py); without one, only that there
        is none."""
        return {"hicache_enabled": False}

    def _insert(self, token_ids: list[int], page_ids: list[int]) -> tuple[int, TreeNode]:
        """insert's work: (tokens present, the node ending at token_ids)."""
        if len(token_ids) != len(page_ids) * self.page_size:
            raise ValueError(
                f"insert needs len(token_ids) == len(page_ids) * page_size, got "
                f"{len(token_ids)} tokens, {len(page_ids)} pages, page_size {self.page_size}"
            )
        node, pos = self.root, 0
        adopted_from = None  # where the tree took the caller's pages for nodes only in the tier
        for node in self._walk(token_ids, len(token_ids), self.root, 0, _any_node):
            if node.value is None:
                # KV only in the second tier, and the caller has it in the pool: the node takes the
                # caller's pages. Pool residency is prefix-closed, so every node after this one on
                # the path is only in the tier too, and the tree adopts page_ids from here on.
                node.value = list(
                    page_ids[pos // self.page_size : (pos + len(node.key)) // self.page_size]
                )
                self.evictable_pages += len(node.value)
                adopted_from = pos if adopted_from is None else adopted_from
            pos += len(node.key)
        if pos < len(token_ids):
            new = TreeNode(list(token_ids[pos:]), list(page_ids[pos // self.page_size :]), node)
            self._touch(new)
            node.children[self._child_key(new.key)] = new
            self.evictable_pages += len(new.value)
            node = new
        return (pos if adopted_from is None else adopted_from), node

    def insert(self, token_ids: list[int], page_ids: list[int]) -> int:
        """Add token_ids (whole pages, KV in page_ids); return how many tokens were present.

        The tree adopts page_ids[prefix // page_size:]; the caller frees its pages for the
        tokens already present. Disabled cache: adopts nothing and returns len(token_ids),
        so the same caller logic frees every page.
        """
        if self.disable:
            return len(token_ids)
        return self._insert(token_ids, page_ids)[0]

    def record_hit(self, node: TreeNode) -> None:
        """A request was admitted with the cached prefix ending at node: count it on every node of
        that path (O(matched nodes); match_prefix split the last edge, so the path covers whole
        edges)."""
        while node is not None and node is not self.root:
            node.hits += 1
            node = node.parent

    # ---- locking and eviction ------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.value)
                self.protected_pages += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, f"unlock of unlocked {node}"
            if node.lock_ref == 1:
                self.evictable_pages += len(node.value)
                self.protected_pages -= len(node.value)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_pages: int) -> int:
        """Free unlocked leaves, least recently used first, until num_pages are freed.

        Whole leaves go, so this may free more than asked; returns pages freed.
        """
        if self.disable or num_pages <= 0:
            return 0
        return self._evict_leaves(self._nodes(), num_pages)

    def evict_subtrees(self, first_token: Callable[[int], bool]) -> int:
        """Evict every unlocked pool page under the root's children whose first token passes
        first_token (an unloaded LoRA adapter's entries: core/lora_slots.py); pages freed."""
        tops = [c for c in self.root.children.values() if first_token(c.key[0])]
        return self._evict_leaves([n for top in tops for n in self._nodes(top)], 1 << 62)

    def _evict_leaves(self, nodes: list[TreeNode], num_pages: int) -> int:
        """evict's loop over the pool leaves among nodes (and the parents they leave bare)."""
        heap = [(n.last_access, n.node_id, n) for n in nodes if self._pool_leaf(n)]
        heapq.heapify(heap)
        num_freed = 0
        while heap and num_freed < num_pages:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            num_freed += len(leaf.value)
            self.evictable_pages -= len(leaf.value)
            self._evict_node(leaf)
            if parent is not self.root and self._pool_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        self._evicted()
        return num_freed

    @staticmethod
    def _pool_leaf(node: TreeNode) -> bool:
        """Unlocked, in the pool, and no child in the pool: its pages may leave the pool."""
        return (
            node.lock_ref == 0
            and node.value is not None
            and not any(c.value is not None for c in node.children.values())
        )

    def _evict_node(self, node: TreeNode) -> None:
        """Without a second tier an evicted node is dropped (tiered_cache.py demotes it instead)."""
        del node.parent.children[self._child_key(node.key)]
        self.allocator.free(node.value)

    def _evicted(self) -> None:
        """Called once an eviction is over (the second tier writes what it demoted then, in one
        batch)."""

    # ---- whole-tree operations -----------------------------------------------------

    def reset(self) -> bool:
        """Flush: free every page in the tree. Refused (False) while any node is locked."""
        if self.protected_pages > 0:
            return False
        self.allocator.free(self.all_page_ids())
        # keep the root object: idle reqs may still point at it as their last_node
        self.root.children = {}
        self.evictable_pages = 0
        return True

    def _nodes(self, top: TreeNode | None = None) -> list[TreeNode]:
        """Every non-root node (or top and those under it), parents before children."""
        out, stack = [], [top] if top is not None else list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def total_pages(self) -> int:
        return self.evictable_pages + self.protected_pages

    def all_page_ids(self) -> list[int]:
        """The pool pages the tree holds."""
        return [p for node in self._nodes() if node.value is not None for p in node.value]

    def check_integrity(self) -> None:
        assert self.root.parent is None and not self.root.key and not self.root.value
        num_evictable = num_protected = 0
        seen: set[int] = set()
        for node in self._nodes():
            assert node.key and len(node.key) % self.page_size == 0, f"bad key length in {node}"
            assert node.parent.children.get(self._child_key(node.key)) is node, (
                f"child key of {node}"
            )
            assert node.lock_ref >= 0, f"negative lock in {node}"
            assert node.parent is self.root or node.parent.lock_ref >= node.lock_ref, (
                f"{node} locked more than its parent"
            )
            assert not node.loading, f"{node} still marked as loading"
            if node.value is None:  # only in the second tier: never borrowed, and it holds the KV
                assert node.host_value is not None and not node.lock_ref, (
                    f"{node}: no KV anywhere, or locked"
                )
                continue
            assert len(node.value) == len(node.key) // self.page_size, f"pages != tokens in {node}"
            assert node.parent is self.root or node.parent.value is not None, (
                f"{node} in the pool, its parent not"
            )
            for p in node.value:
                assert p not in seen, f"page {p} twice in the tree"
                seen.add(p)
            if node.lock_ref:
                num_protected += len(node.value)
            else:
                num_evictable += len(node.value)
        assert num_evictable == self.evictable_pages, (num_evictable, self.evictable_pages)
        assert num_protected == self.protected_pages, (num_protected, self.protected_pages)
        assert not (seen & self.allocator.free_page_set()), "tree holds a free page"
