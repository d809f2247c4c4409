"""TieredRadixCache (core/tiered_cache.py): the radix tree over two tiers, without a model.

Pool pages hold (position, token) entries (as the fake runner's KV does) and the fake tier copies them, so a
load that brings back the wrong page shows up as the wrong tokens. Truth: a naive model holding the set of
sequences inserted since the last flush. With a tier large enough for everything nothing is ever lost, so a
match through both tiers is exactly the longest whole-page common prefix with some inserted sequence; with a
small tier it is at most that. Every step: check_integrity (every node's KV in the pool, the tier or both;
pool residency prefix-closed; tier pages held once; locked nodes in the pool), locked paths never leave the
pool, and loaded pages hold the query's own tokens.
"""

from __future__ import annotations

import os

import pytest
from fake_runner import FakeTierStore
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixrt.runtime.core.page_allocator import PageAllocator
from radixrt.runtime.core.tiered_cache import TieredRadixCache


class Harness:
    def __init__(
        self,
        pool_pages: int,
        tier_pages: int,
        page_size: int,
        policy: str = "write_back",
        min_tokens: int = 1,
    ):
        self.ps = page_size
        self.kv: dict[int, tuple[int, int]] = {}
        self.store = FakeTierStore(self.kv, page_size, tier_pages)
        self.alloc = PageAllocator(pool_pages, page_size)
        self.tree = TieredRadixCache(self.alloc, page_size, self.store, policy, min_tokens)

    def insert(self, tokens: list[int]) -> bool:
        """Compute `tokens` (whole pages) into fresh pool pages and cache them, as a finished request does."""
        n = len(tokens) // self.ps
        if self.alloc.num_free < n:
            self.tree.evict(n - self.alloc.num_free)
        pages = self.alloc.alloc(n)
        if pages is None:
            return False
        for i, tok in enumerate(tokens[: n * self.ps]):
            self.kv[pages[i // self.ps] * self.ps + i % self.ps] = (i, tok)
        present = self.tree.insert(tokens[: n * self.ps], pages)
        self.alloc.free(pages[: present // self.ps])
        return True

    def match(self, query: list[int], load: bool = True) -> int:
        """Tokens matched through both tiers (loading the tier's part back); checks the pool pages' contents."""
        pages, node = self.tree.match_prefix(query)
        in_tier = self.tree.match_tier(query, node, len(pages) * self.ps)
        total = (len(pages) + sum(len(n.host_value) for n in in_tier)) * self.ps
        if load and in_tier:
            self.tree.inc_lock_ref(node)
            loaded, last = self.tree.load_back(in_tier)
            self.tree.dec_lock_ref(node)
            pages += loaded
            assert last is not None or not loaded
        if load:
            for i in range(len(pages) * self.ps):
                assert self.kv.get(pages[i // self.ps] * self.ps + i % self.ps) == (i, query[i]), i
        return total


def lcp_pages(a: list[int], b: list[int], ps: int) -> int:
    n = len(os.path.commonprefix([a, b]))
    return n - n % ps


def test_eviction_demotes_and_a_match_loads_back():
    h = Harness(pool_pages=8, tier_pages=32, page_size=2)
    first = [1, 2, 3, 4, 5, 6, 7, 8]
    assert h.insert(first)
    assert h.insert([9, 9, 8, 8, 7, 7, 6, 6])  # the pool is full
    assert h.tree.evict(8) == 8
    assert h.alloc.num_free == 8 and h.store.writes == 1, "one batched write for the whole eviction"
    assert h.tree.match_prefix(first)[0] == []  # nothing in the pool
    assert h.match(first + [0, 0]) == 8  # loaded back from the tier, contents checked
    assert h.tree.tier_stats.tokens_loaded == 8 and h.tree.tier_stats.hits == 1
    node = h.tree.match_prefix(first)[1]
    assert node.value is not None and node.host_value is not None, "now in both tiers"
    h.tree.check_integrity()
    h.tree.evict(8)  # already in the tier: the pool copy just goes, nothing is written again
    assert h.store.writes == 1
    h.tree.check_integrity()


def test_locked_paths_stay_in_the_pool_and_flush_clears_both_tiers():
    h = Harness(pool_pages=6, tier_pages=16, page_size=1)
    assert h.insert([1, 2, 3])
    _, node = h.tree.match_prefix([1, 2, 3])
    h.tree.inc_lock_ref(node)
    assert h.insert([4, 5, 6])
    h.tree.evict(6)
    assert h.tree.match_prefix([1, 2, 3])[0] != [], "a locked path is never demoted"
    assert not h.tree.reset(), "flush is refused while a path is locked"
    h.tree.dec_lock_ref(node)
    h.tree.evict(6)
    assert h.tree.host.num_free < 16
    assert h.tree.reset()
    assert h.tree.host.num_free == 16 and h.alloc.num_free == 6 and not h.tree.root.children
    h.tree.check_integrity()


def test_a_corrupt_tier_page_is_dropped_and_recomputed_never_used():
    h = Harness(pool_pages=8, tier_pages=16, page_size=2)
    seq = [1, 2, 3, 4, 5, 6]
    h.insert(seq)
    h.tree.evict(8)
    in_tier = h.tree.match_tier(seq, h.tree.root, 0)
    h.store.corrupt.add(in_tier[0].host_value[1])  # the second page of the run
    assert h.match(seq) == 6  # the match saw 6 tokens, but only the page before the bad one loads
    assert h.tree.tier_stats.checksum_failures == 1
    assert h.match(seq, load=False) == 0, (
        "the corrupt run is gone from the tree (its first page was in it)"
    )
    h.tree.check_integrity()


def test_a_run_shorter_than_min_tokens_is_recomputed_not_swapped():
    h = Harness(pool_pages=4, tier_pages=16, page_size=1, min_tokens=3)
    h.insert([1, 2])
    h.tree.evict(2)
    assert h.store.writes == 0 and h.match([1, 2, 0], load=False) == 0
    h.insert([5, 6, 7])
    h.tree.evict(3)
    assert h.store.writes == 1 and h.match([5, 6, 7], load=False) == 3


@pytest.mark.parametrize(
    "policy,writes_at_insert,writes_at_hit",
    [("write_back", 0, 0), ("write_through", 1, 0), ("write_through_selective", 0, 1)],
)
def test_write_policies(policy, writes_at_insert, writes_at_hit):
    h = Harness(pool_pages=8, tier_pages=16, page_size=1, policy=policy)
    h.insert([1, 2, 3, 4])
    assert h.store.writes == writes_at_insert
    _, node = h.tree.match_prefix([1, 2, 3])
    h.tree.record_hit(node)
    assert h.store.writes == writes_at_insert + writes_at_hit
    h.tree.evict(8)  # whatever was not written yet is written now
    assert h.match([1, 2, 3, 4, 0]) == 4
    h.tree.check_integrity()


def test_the_tier_has_its_own_lru():
    h = Harness(pool_pages=4, tier_pages=4, page_size=1)
    for seq in ([1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]):
        h.insert(seq)
        h.tree.evict(4)
    assert h.match([1, 1, 1, 1], load=False) == 0, "the oldest run left the full tier"
    assert h.match([2, 2, 2, 2], load=False) == 0 and h.match([3, 3, 3, 3]) == 4
    assert h.tree.tier_stats.nodes_dropped >= 2
    h.tree.check_integrity()


def test_a_request_recomputing_tier_tokens_gives_the_node_its_pages():
    """insert through a node only in the tier: the node takes the caller's pool pages (both tiers now)."""
    h = Harness(pool_pages=8, tier_pages=16, page_size=1)
    h.insert([1, 2, 3, 4])
    h.tree.evict(8)
    assert h.insert([1, 2, 3, 4, 5, 6])
    node = h.tree.match_prefix([1, 2, 3, 4, 5, 6])[1]
    assert len(h.tree.match_prefix([1, 2, 3, 4, 5, 6])[0]) == 6, "all of it in the pool again"
    assert node.parent.host_value is not None and node.parent.value is not None
    assert h.match([1, 2, 3, 4, 5, 6]) == 6
    h.tree.check_integrity()


def path_pages(node) -> list[int]:
    """The pool pages from the root down to node (a split moves pages between nodes, not off the path)."""
    out = []
    while node.parent is not None:
        out = node.value + out
        node = node.parent
    return out


def test_writes_of_an_eviction_finish_before_the_load_that_caused_it():
    """load_back needs pool pages, so it evicts first: the demoted node's write goes out (and returns) before the
    read, and the two touch different tier pages; both come back with the right tokens."""
    h = Harness(pool_pages=4, tier_pages=16, page_size=1)
    h.insert([1, 2, 3, 4])
    h.tree.evict(4)
    h.insert([5, 6, 7, 8])  # the pool is full again
    assert h.match([1, 2, 3, 4, 0]) == 4
    (kind_w, written), (kind_r, read) = h.store.log[-2:]
    assert (kind_w, kind_r) == ("write", "read") and not set(written) & set(read)
    assert h.match([5, 6, 7, 8, 0]) == 4
    h.tree.check_integrity()


def test_a_node_dropped_with_its_write_pending_is_not_written():
    """One eviction demotes a child (its write pending), then finds no tier room for the parent and drops it
    with the child: the batch must not write the dropped child."""
    h = Harness(pool_pages=16, tier_pages=10, page_size=2)
    h.insert([1] * 14)
    h.insert([1] * 6 + [2] * 8)  # [1]*6 -> [1]*8 | [2]*8: 11 pages, the tier holds 10
    h.tree.evict(
        16
    )  # both children demoted (8 tier pages, writes pending), then no room for the parent
    h.tree.check_integrity()
    assert h.match([1] * 14, load=False) == 0 and h.tree.host.num_free == 10, (
        "the whole subtree went"
    )
    assert h.store.writes == 0, "nothing was left to write"


def test_the_tier_lru_frees_each_node_once():
    """A node in both tiers whose tier-only children are dropped for room is not queued twice."""
    h = Harness(pool_pages=12, tier_pages=10, page_size=1)
    h.insert([9, 9])
    h.tree.evict(12)
    h.insert([1, 1, 2, 2])
    h.insert([1, 1, 3, 3])
    h.tree.evict(12)  # the tier: [9,9], [1,1] -> [2,2] | [3,3]
    assert (
        h.match([1, 1, 0]) == 2
    )  # [1,1] back in the pool too (both tiers), its children only in the tier
    _, node = h.tree.match_prefix([1, 1])
    h.tree.inc_lock_ref(node)
    h.insert([5, 5])
    h.tree.evict(12)  # the tier is full
    h.insert([7] * 10)
    h.tree.evict(
        12
    )  # writing [7]*10 needs the whole tier: [9,9], [2,2], [3,3], [1,1]'s copy, [5,5], each once
    h.tree.check_integrity()
    assert (
        h.match([7] * 10 + [0], load=False) == 10
        and node.host_value is None
        and node.value is not None
    )
    h.tree.dec_lock_ref(node)


class TwoTierMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ps = 2
        size = os.environ.get("_TIER_SIZE", "big")
        self.big_tier = size == "big"
        pool, tier = {"big": (12, 400), "small": (12, 10), "smaller_than_pool": (16, 6)}[size]
        self.h = Harness(pool_pages=pool, tier_pages=tier, page_size=self.ps)
        self.inserted: list[list[int]] = []
        self.locks: list = []

    tokens = st.lists(st.integers(1, 3), min_size=2, max_size=14)

    @rule(seq=tokens)
    def insert(self, seq):
        if self.h.insert(seq):
            self.inserted.append(seq[: len(seq) - len(seq) % self.ps])

    @rule(query=tokens)
    def match(self, query):
        truth = max([lcp_pages(s, query, self.ps) for s in self.inserted] + [0])
        got = self.h.match(query)
        assert got <= truth
        if self.big_tier:
            assert got == truth, "a tier large enough for everything loses nothing"

    @rule(query=tokens)
    def lock(self, query):
        _, node = self.h.tree.match_prefix(query)
        self.h.tree.inc_lock_ref(node)
        self.locks.append((node, path_pages(node)))

    @precondition(lambda self: self.locks)
    @rule()
    def unlock(self):
        node, _ = self.locks.pop(0)
        self.h.tree.dec_lock_ref(node)

    @rule(n=st.integers(1, 12))
    def evict(self, n):
        self.h.tree.evict(n)

    @precondition(lambda self: not self.locks)
    @rule()
    def flush(self):
        assert self.h.tree.reset()
        self.inserted = []

    @invariant()
    def holds(self):
        self.h.tree.check_integrity()
        for node, pages in self.locks:  # a locked path keeps its very pool pages (edges may split)
            assert path_pages(node) == pages


@pytest.mark.parametrize("size", ["big", "small", "smaller_than_pool"])
def test_two_tiers_against_a_naive_model(size, monkeypatch):
    monkeypatch.setenv("_TIER_SIZE", size)
    TwoTierMachine.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    TwoTierMachine.TestCase().runTest()
