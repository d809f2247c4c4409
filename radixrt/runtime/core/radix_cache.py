"""Token-keyed radix tree over KV pages: match, insert, lock, LRU leaf eviction.

An edge is a run of token ids whose length is a multiple of page_size; its node holds
the page ids of that run (one per page), so the tree only ever shares whole pages: a
partially filled page is private to the request that writes it. Requests borrow a path
read-only and pin it with a lock; only unlocked leaves are evicted, least recently used
first. No tensors here: ints and lists only, so this is tested without a model.
"""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Any

from radixrt.runtime.core.page_allocator import PageAllocator


class TreeNode:
    _ids = itertools.count()

    def __init__(self, key: list[int], value: list[int], parent: TreeNode | None):
        self.key = key  # token ids of the edge into this node
        self.value = value  # page ids of those tokens, len(key) // page_size of them
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.last_access_time = 0.0  # time.time() of the last match or insert through it (for the cache view)
        self.hits = 0  # requests admitted with a cached prefix that ran through this whole edge
        self.node_id = next(TreeNode._ids)  # ties in the LRU heap break deterministically

    def __repr__(self) -> str:
        return f"TreeNode(#{self.node_id}, tokens={len(self.key)}, pages={self.value}, lock={self.lock_ref})"


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

    # ---- lookup and insertion ------------------------------------------------------

    def _child_key(self, token_ids: list[int], start: int = 0) -> Any:
        if self.page_size == 1:
            return token_ids[start]
        return tuple(token_ids[start:start + self.page_size])

    def _match_len(self, key: list[int], token_ids: list[int], start: int) -> int:
        """Tokens of key equal to token_ids[start:], rounded down to whole pages."""
        n = min(len(key), len(token_ids) - start)
        i = 0
        while i < n and key[i] == token_ids[start + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut child's edge after split_len tokens; return the new upper node."""
        assert 0 < split_len < len(child.key) and split_len % self.page_size == 0
        num_pages = split_len // self.page_size
        upper = TreeNode(child.key[:split_len], child.value[:num_pages], child.parent)
        # same lock and age as before the cut, so counts and LRU order do not change
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.last_access_time = child.last_access_time
        upper.hits = child.hits  # every match through the whole child ran through its first part
        child.parent.children[self._child_key(upper.key)] = upper
        child.key = child.key[split_len:]
        child.value = child.value[num_pages:]
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], TreeNode]:
        """Pages of the longest cached whole-page prefix of token_ids, and its last node.

        Splits an edge where the match ends inside it, so the returned node ends exactly
        at the match and can be locked without pinning tokens the caller does not use.
        """
        if self.disable:
            return [], self.root
        self._clock += 1
        now = time.time()
        page_ids: list[int] = []
        node, pos = self.root, 0
        aligned_len = len(token_ids) - len(token_ids) % self.page_size
        while pos < aligned_len:
            child = node.children.get(self._child_key(token_ids, pos))
            if child is None:
                break
            match_len = self._match_len(child.key, token_ids, pos)
            assert match_len > 0, "child keyed by its first page must match that page"
            if match_len < len(child.key):
                child = self._split(child, match_len)
            child.last_access, child.last_access_time = self._clock, now
            page_ids.extend(child.value)
            node, pos = child, pos + match_len
        return page_ids, node

    def _insert(self, token_ids: list[int], page_ids: list[int]) -> tuple[int, TreeNode]:
        if len(token_ids) != len(page_ids) * self.page_size:
            raise ValueError(f"insert needs len(token_ids) == len(page_ids) * page_size, got "
                             f"{len(token_ids)} tokens, {len(page_ids)} pages, page_size {self.page_size}")
        self._clock += 1
        now = time.time()
        node, pos = self.root, 0
        while pos < len(token_ids):
            child = node.children.get(self._child_key(token_ids, pos))
            if child is None:
                new = TreeNode(list(token_ids[pos:]), list(page_ids[pos // self.page_size:]), node)
                new.last_access, new.last_access_time = self._clock, now
                node.children[self._child_key(new.key)] = new
                self.evictable_pages += len(new.value)
                return pos, new
            match_len = self._match_len(child.key, token_ids, pos)
            if match_len < len(child.key):
                child = self._split(child, match_len)
            child.last_access, child.last_access_time = self._clock, now
            node, pos = child, pos + match_len
        return pos, node

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
        """A request was admitted with the cached prefix ending at node: count it on every node of that
        path (O(matched nodes); match_prefix split the last edge, so the path covers whole edges)."""
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
        heap = [(n.last_access, n.node_id, n) for n in self._nodes()
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        num_freed = 0
        while heap and num_freed < num_pages:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            self.allocator.free(leaf.value)
            num_freed += len(leaf.value)
            self.evictable_pages -= len(leaf.value)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return num_freed

    # ---- request lifecycle ---------------------------------------------------------

    def _cache_req_prefix(self, req: Any, token_ids: list[int]) -> int:
        """Insert the req's whole pages; free its pages duplicating ones already cached."""
        if len(token_ids) != req.kv_len:
            raise ValueError(f"token_ids has {len(token_ids)} tokens, req {req.rid} holds KV of {req.kv_len}")
        assert req.cached_len % self.page_size == 0, "borrowed prefix must be whole pages"
        aligned_len = req.kv_len - req.kv_len % self.page_size
        num_aligned_pages = aligned_len // self.page_size
        assert len(req.page_ids) >= num_aligned_pages, "req holds fewer pages than its kv_len needs"
        prefix_len = self.insert(token_ids[:aligned_len], req.page_ids[:num_aligned_pages])
        # the borrowed prefix is still locked, so it is found again
        assert prefix_len >= req.cached_len
        self.allocator.free(req.page_ids[req.cached_len // self.page_size:prefix_len // self.page_size])
        return aligned_len

    def cache_finished_req(self, req: Any, token_ids: list[int]) -> None:
        """Hand a finished req's KV to the tree; the req ends with no pages and no lock."""
        if self.disable:
            assert req.cached_len == 0
            self.allocator.free(req.page_ids)
        else:
            aligned_len = self._cache_req_prefix(req, token_ids)
            self.allocator.free(req.page_ids[aligned_len // self.page_size:])  # partial and unused
            self.dec_lock_ref(req.last_node)
        req.page_ids, req.kv_len, req.cached_len, req.last_node = [], 0, 0, None

    def cache_unfinished_req(self, req: Any, token_ids: list[int]) -> None:
        """Make a running req's whole pages visible to others; it now borrows them from the tree."""
        if self.disable:
            return
        aligned_len = self._cache_req_prefix(req, token_ids)
        num_aligned_pages = aligned_len // self.page_size
        tree_page_ids, new_last = self.match_prefix(token_ids[:aligned_len])
        assert len(tree_page_ids) == num_aligned_pages
        req.page_ids[:num_aligned_pages] = tree_page_ids
        # lock the new path before unlocking the old, so the shared part never looks free
        self.inc_lock_ref(new_last)
        self.dec_lock_ref(req.last_node)
        req.cached_len, req.last_node = aligned_len, new_last

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

    def _nodes(self) -> list[TreeNode]:
        """Every non-root node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def total_pages(self) -> int:
        return self.evictable_pages + self.protected_pages

    def all_page_ids(self) -> list[int]:
        return [p for node in self._nodes() for p in node.value]

    def pretty_print(self) -> str:
        lines = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in sorted(node.children.values(), key=lambda n: n.key):
                lines.append(f"{'  ' * depth}{child.key} pages={child.value} "
                             f"lock={child.lock_ref} t={child.last_access}")
                walk(child, depth + 1)

        walk(self.root, 0)
        lines.append(f"evictable={self.evictable_pages} protected={self.protected_pages}")
        return "\n".join(lines)

    def check_integrity(self) -> None:
        assert self.root.parent is None and not self.root.key and not self.root.value
        num_evictable = num_protected = 0
        seen: set[int] = set()
        for node in self._nodes():
            assert node.key and len(node.key) % self.page_size == 0, f"bad key length in {node}"
            assert len(node.value) == len(node.key) // self.page_size, f"pages != tokens in {node}"
            assert node.parent.children.get(self._child_key(node.key)) is node, f"child key of {node}"
            assert node.lock_ref >= 0, f"negative lock in {node}"
            assert node.parent is self.root or node.parent.lock_ref >= node.lock_ref, \
                f"{node} locked more than its parent"
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
