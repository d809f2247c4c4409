"""The second cache tier (--enable-hierarchical-cache, SGLang's HiCache): KV the pool evicts moves
to host memory or a file instead of being dropped, and a later match copies it back instead of
recomputing it.

Every node's KV is in the pool (`value`), in the tier (`host_value`), or both. Pool residency is
prefix-closed (a node in the pool has its parent in the pool), so a match is pool nodes
(`match_prefix`) then tier-only nodes (`match_tier`), which admission loads back (`load_back`, one
batched copy) before the request's extend. Eviction from the pool takes the least recently used
unlocked node with no child in the pool and demotes it: written to the tier unless already there,
then its pool pages are free. The tier has its own LRU: for room it drops the tier copy of a node
still in the pool, or a tier-only leaf, least recently used first; never a node being loaded or one
whose write is pending.

Write policies (--hicache-write-policy, SGLang's names): write_back (default) writes a node when the
pool evicts it, so KV the pool never gives up is never copied; write_through writes a node when it
enters the tree (eviction is then free, every prefill pays a copy); write_through_selective writes
it when a second request reuses it.

Swap or recompute: a node of fewer than `min_tokens` tokens is dropped, not written, unless it has
tier-only children (they are reached through it). A preempted request's KV goes into the tree like a
finished one's (Scheduler.preempt), so it is swapped out when the pool evicts it and loaded back
when the request resumes.

The copies are the store's (model/kv_tier.py; tests use a fake): write(pool_pages, tier_pages) and
read(tier_pages, pool_pages) -> the index of the first page whose checksum failed, or None. Pages
from there on are not copied, and their nodes are dropped: corrupt KV is recomputed, never used.
Both calls are synchronous and the writes an eviction demotes go out in one batch before the evicted
pool pages can be reused, so no tier page is read while a write to it is in flight.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.page_allocator import PageAllocator
from radixrt.runtime.core.plan import Runner
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.tree_node import TreeNode

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
log = logging.getLogger(__name__)


def _tier_only(node: TreeNode) -> bool:
    assert node.value is None, "match_prefix stopped before a pool node"
    return True


class TierStore(Protocol):
    num_pages: int
    page_bytes: int

    def write(self, pool_pages: list[int], tier_pages: list[int]) -> None: ...

    def read(self, tier_pages: list[int], pool_pages: list[int]) -> int | None: ...


@dataclass
class TierStats:
    hits: int = 0  # matches that loaded KV back from the tier
    tokens_loaded: int = 0
    tokens_written: int = 0
    load_seconds: float = 0.0
    write_seconds: float = 0.0
    checksum_failures: int = 0  # loads that found a corrupt page (its nodes dropped, recomputed)
    nodes_dropped: int = 0  # nodes the tier gave up for room (or too short to keep)
    load_latencies: deque = field(default_factory=lambda: deque(maxlen=4096))  # s per load_back


class TieredRadixCache(RadixCache):
    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        store: TierStore,
        write_policy: str = "write_back",
        min_tokens: int = 1,
    ):
        super().__init__(allocator, page_size)
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"hicache_write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}"
            )
        self.store = store
        self.host = PageAllocator(store.num_pages, page_size)
        self.write_policy = write_policy
        self.min_tokens = min_tokens
        self.tier_stats = TierStats()
        # (node, its pool pages) to write in one batch
        self._pending: list[tuple[TreeNode, list[int]]] = []

    # ---- matching into the tier and loading back -------------------------------------------------

    def match_tier(self, token_ids: list[int], node: TreeNode, pos: int) -> list[TreeNode]:
        """The tier-only nodes continuing a pool match that ended at `node`, `pos` tokens in (whole
        pages; the last edge is split where the match ends, as match_prefix does)."""
        aligned_len = len(token_ids) - len(token_ids) % self.page_size
        return list(self._walk(token_ids, aligned_len, node, pos, _tier_only))

    def load_back(self, nodes: list[TreeNode]) -> tuple[list[int], TreeNode | None]:
        """Copy match_tier's nodes into pool pages (evicting others for room; the caller has locked
        the pool path above them). Returns the pool pages loaded and the last node loaded (None:
        nothing). A corrupt page ends the load: its node and everything below it are dropped."""
        num_pages = sum(len(n.host_value) for n in nodes)
        for n in nodes:
            n.loading = True
        try:
            if self.allocator.num_free < num_pages:
                self.evict(num_pages - self.allocator.num_free)
            pool = self.allocator.alloc(num_pages)
        finally:
            for n in nodes:
                n.loading = False
        if pool is None or not nodes:
            return [], None
        t0 = time.perf_counter()
        try:
            bad = self.store.read([p for n in nodes for p in n.host_value], pool)
        except Exception:  # noqa: BLE001 - an unreadable tier (a deleted file): never fail the step
            log.exception("second cache tier: loading %d pages failed; recomputing them", num_pages)
            bad = 0
        elapsed = time.perf_counter() - t0
        good = num_pages if bad is None else bad
        taken, loaded = 0, []
        for n in nodes:
            if taken + len(n.host_value) > good:
                break
            n.value = pool[taken : taken + len(n.host_value)]
            taken += len(n.value)
            self.evictable_pages += len(n.value)
            loaded.append(n)
        self.allocator.free(pool[taken:])
        if len(loaded) < len(nodes):
            self.tier_stats.checksum_failures += 1
            self._drop_subtree(nodes[len(loaded)])
        st = self.tier_stats
        st.hits += bool(loaded)
        st.tokens_loaded += taken * self.page_size
        st.load_seconds += elapsed
        st.load_latencies.append(elapsed)
        return pool[:taken], (loaded[-1] if loaded else None)

    # ---- writing to the tier ---------------------------------------------------------------------

    def _evict_node(self, node: TreeNode) -> None:
        pages, node.value = node.value, None
        self.allocator.free(pages)  # written (below, in _evicted) before anything can reuse them
        if node.host_value is not None:
            return  # already in the tier: only the pool copy goes
        if (len(node.key) >= self.min_tokens or node.children) and self._host_alloc(node):
            self._pending.append((node, pages))
        else:
            self._drop_subtree(node)

    def _evicted(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pool = [p for _, pages in self._pending for p in pages]
        host = [p for node, _ in self._pending for p in node.host_value]
        self._pending = []
        t0 = time.perf_counter()
        self.store.write(pool, host)
        self.tier_stats.write_seconds += time.perf_counter() - t0
        self.tier_stats.tokens_written += len(pool) * self.page_size

    def _write_path(self, node: TreeNode) -> None:
        """Write-through: the nodes on node's path that are in the pool but not yet in the tier."""
        while node is not self.root:
            if node.host_value is None and node.value is not None and self._host_alloc(node):
                self._pending.append((node, node.value))
            node = node.parent
        self._flush()

    def _insert(self, token_ids: list[int], page_ids: list[int]) -> tuple[int, TreeNode]:
        pos, node = super()._insert(token_ids, page_ids)
        if self.write_policy == "write_through" and node is not self.root:
            self._write_path(node)
        return pos, node

    def record_hit(self, node: TreeNode) -> None:
        super().record_hit(node)
        if self.write_policy == "write_through_selective":
            self._write_path(node)

    def _host_alloc(self, node: TreeNode) -> bool:
        need = len(node.key) // self.page_size
        if self.host.num_free < need:
            self._make_room(need - self.host.num_free)
        node.host_value = self.host.alloc(need)
        return node.host_value is not None

    def _make_room(self, num_pages: int) -> None:
        """Free tier pages, LRU first: tier copies of pool nodes, then whole tier-only leaves."""
        pending = {id(n) for n, _ in self._pending}
        heap = [
            (n.last_access, n.node_id, n) for n in self._nodes() if self._tier_droppable(n, pending)
        ]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, node = heapq.heappop(heap)
            if node.host_value is None:  # dropped with a subtree earlier in this loop
                continue
            freed += len(node.host_value)
            if node.value is not None:
                self.host.free(node.host_value)
                node.host_value = None
                continue
            parent = node.parent
            self._drop_subtree(node)
            # a parent only in the tier is now a leaf; one also in the pool was in the heap already
            if (
                parent is not self.root
                and parent.value is None
                and self._tier_droppable(parent, pending)
            ):
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))

    @staticmethod
    def _tier_droppable(node: TreeNode, pending: set[int]) -> bool:
        return (
            node.host_value is not None
            and not node.loading
            and id(node) not in pending
            and (node.value is not None or not node.children)
        )

    def _drop_subtree(self, node: TreeNode) -> None:
        """Remove a node whose pool pages are gone, and everything below it (only in the tier)."""
        del node.parent.children[self._child_key(node.key)]
        stack = [node]
        while stack:
            n = stack.pop()
            assert n.value is None and n.lock_ref == 0 and not n.loading, f"dropping {n}"
            if n.host_value is not None:
                self.host.free(n.host_value)
                n.host_value = None
            self.tier_stats.nodes_dropped += 1
            stack.extend(n.children.values())
        if self._pending:  # a demoted node whose write was pending went with it: nothing to write
            self._pending = [(n, pages) for n, pages in self._pending if n.host_value is not None]

    # ---- whole-tree operations -------------------------------------------------------------------

    def reset(self) -> bool:
        """Flush both tiers (refused while any node is locked)."""
        if self.protected_pages > 0:
            return False
        for node in self._nodes():
            if node.host_value is not None:
                self.host.free(node.host_value)
                node.host_value = None
        return super().reset()

    def host_page_ids(self) -> list[int]:
        return [p for n in self._nodes() if n.host_value is not None for p in n.host_value]

    def check_integrity(self) -> None:
        super().check_integrity()
        assert not self._pending, "tier writes left pending"
        held = self.host_page_ids()
        free = self.host.free_page_set()
        assert len(set(held)) == len(held), "a tier page held by two nodes"
        assert not set(held) & free, "a node holds a free tier page"
        assert len(held) + len(free) == self.host.num_pages, "tier pages leaked"
        for n in self._nodes():
            if n.host_value is not None:
                assert len(n.host_value) == len(n.key) // self.page_size, (
                    f"tier pages != tokens in {n}"
                )

    def tier_info(self) -> dict[str, Any]:
        st = self.tier_stats
        lat = sorted(st.load_latencies)
        return {
            "hicache_enabled": True,
            "hicache_pages_total": self.host.num_pages,
            "hicache_pages_used": self.host.num_pages - self.host.num_free,
            "hicache_write_policy": self.write_policy,
            "hicache_hits": st.hits,
            "hicache_tokens_loaded": st.tokens_loaded,
            "hicache_tokens_written": st.tokens_written,
            "hicache_bytes_loaded": st.tokens_loaded // self.page_size * self.store.page_bytes,
            "hicache_bytes_written": st.tokens_written // self.page_size * self.store.page_bytes,
            "hicache_load_seconds": st.load_seconds,
            "hicache_write_seconds": st.write_seconds,
            "hicache_load_latency_p50_s": lat[len(lat) // 2] if lat else None,
            "hicache_load_latency_p99_s": lat[min(len(lat) - 1, int(len(lat) * 0.99))]
            if lat
            else None,
            "hicache_checksum_failures": st.checksum_failures,
            "hicache_nodes_dropped": st.nodes_dropped,
        }


# Shorter runs are recomputed, not swapped: at the default page size a whole step's demotions go out
# in one batched copy, whose fixed cost is about that of computing a few tokens (bench_hicache.py).
MIN_SWAP_TOKENS = 4


def make_tree(config: ServerConfig, allocator: PageAllocator, runner: Runner) -> RadixCache:
    """The scheduler's radix tree: with --enable-hierarchical-cache, on the runner's second tier."""
    if not config.enable_hierarchical_cache:
        return RadixCache(allocator, config.page_size, disable=config.disable_radix_cache)
    return TieredRadixCache(
        allocator,
        config.page_size,
        runner.make_kv_tier(config),
        config.hicache_write_policy,
        MIN_SWAP_TOKENS,
    )
