"""RadixCache: hand-written cases, then a hypothesis state machine against a naive model.

The naive model is a dict {cached whole-page prefix (tuple of tokens): last access stamp};
a radix tree with page size P holds exactly a prefix-closed set of such prefixes, one page each.
Every page carries a fake "content": the token prefix whose KV a real forward would have
written there, so a match that returns the wrong page is caught.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixrt.runtime.core.cache_view import pretty_print
from radixrt.runtime.core.page_allocator import PageAllocator, TableRows
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.request.sampling_params import SamplingParams


def make(num_pages=64, page_size=1, disable=False):
    alloc = PageAllocator(num_pages, page_size)
    return alloc, RadixCache(alloc, page_size, disable=disable)


def memory(alloc, cache):
    """What moves a request's pages into and out of the tree (the tree knows nothing of requests)."""
    return ReqMemory(alloc, cache, TableRows(1))


def put(alloc, cache, ids):
    """Insert ids (whole pages) with fresh pages, freeing duplicates as a caller must."""
    pages = alloc.alloc(len(ids) // cache.page_size)
    present = cache.insert(ids, pages)
    alloc.free(pages[: present // cache.page_size])
    return pages, present


def depth(node):
    n = 0
    while node.parent is not None:
        n, node = n + len(node.key), node.parent
    return n


def assert_partition(alloc, cache, held=()):
    free, tree, held = alloc.free_page_set(), cache.all_page_ids(), list(held)
    assert len(free) + len(tree) + len(held) == alloc.num_pages
    assert free | set(tree) | set(held) == set(range(alloc.num_pages))


def test_edge_split():
    alloc, cache = make()
    pages, _ = put(alloc, cache, [1, 2, 3, 4, 5])
    got, node = cache.match_prefix([1, 2, 3, 9])
    assert got == pages[:3] and node.key == [1, 2, 3] and depth(node) == 3
    assert [c.key for c in node.children.values()] == [[4, 5]]
    assert list(cache.root.children.values()) == [node]
    cache.check_integrity()
    assert cache.match_prefix([1, 2, 3, 4, 5, 6])[0] == pages
    assert cache.match_prefix([2, 1])[0] == []


@pytest.mark.parametrize("page_size", [4, 16])
def test_page_aligned_matching(page_size):
    P = page_size
    alloc, cache = make(page_size=P)
    ids = list(range(100, 100 + 3 * P))
    pages, _ = put(alloc, cache, ids)
    assert cache.match_prefix(ids)[0] == pages
    assert cache.match_prefix(ids + [7])[0] == pages
    assert cache.match_prefix(ids[: 2 * P + P - 1])[0] == pages[:2], "a partial page never matches"
    diverge = ids[: P + 2] + [0] * (2 * P)  # differs inside the second page
    got, node = cache.match_prefix(diverge)
    assert got == pages[:1] and depth(node) == P
    assert cache.match_prefix([0] + ids[1:])[0] == []
    assert cache.match_prefix(ids[: P - 1])[0] == []
    cache.check_integrity()
    # inserting the diverging sequence shares exactly one page
    _, present = put(alloc, cache, diverge[: 3 * P])
    assert present == P and cache.total_pages() == 5
    cache.check_integrity()


def test_insert_needs_whole_pages():
    alloc, cache = make(page_size=4)
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3, 4, 5], alloc.alloc(1))


def test_lru_order():
    alloc, cache = make(page_size=2)
    a, _ = put(alloc, cache, [1, 1])
    b, _ = put(alloc, cache, [2, 2])
    c, _ = put(alloc, cache, [3, 3])
    cache.match_prefix([1, 1])  # a is now the most recent
    assert cache.evict(1) == 1 and sorted(cache.all_page_ids()) == sorted(a + c)
    assert set(b) <= alloc.free_page_set()
    assert cache.evict(1) == 1 and cache.all_page_ids() == a
    assert cache.match_prefix([1, 1, 5])[0] == a
    assert cache.evict(5) == 1 and cache.total_pages() == 0
    assert cache.evict(5) == 0


def test_locked_never_evicted():
    alloc, cache = make()
    a, _ = put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [7, 8])
    _, node = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    assert cache.protected_pages == 3 and cache.evictable_pages == 2
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3])[0] == a
    assert not cache.reset(), "flush refused while locked"
    cache.dec_lock_ref(node)
    assert cache.evict(100) == 0, "still locked once"
    cache.dec_lock_ref(node)
    assert cache.protected_pages == 0 and cache.evictable_pages == 3
    cache.check_integrity()
    assert cache.evict(1) == 3 and alloc.num_free == alloc.num_pages


def test_lock_on_prefix_protects_path_only():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    _, node = cache.match_prefix([1, 2, 9])  # splits [1,2 | 3,4]
    cache.inc_lock_ref(node)
    assert cache.protected_pages == 2 and cache.evictable_pages == 2
    assert cache.evict(10) == 2 and cache.match_prefix([1, 2, 3, 4])[0] != []
    cache.check_integrity()
    cache.dec_lock_ref(node)


def test_parent_evictable_after_last_child():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4])  # [1,2] -> {[3], [4]}
    assert cache.evict(1) == 1
    assert len(cache.match_prefix([1, 2, 3])[0]) == 2, "older leaf [3] went first"
    assert len(cache.match_prefix([1, 2, 4])[0]) == 3
    assert cache.evict(1) == 1, "[4] goes, not its parent"
    assert len(cache.match_prefix([1, 2])[0]) == 2
    assert cache.evict(1) == 2, "the parent is now a leaf and goes whole"
    assert cache.total_pages() == 0 and alloc.num_free == alloc.num_pages


def test_duplicate_insert_count():
    alloc, cache = make(page_size=2)
    first, present = put(alloc, cache, [1, 2, 3, 4, 5, 6])
    assert present == 0
    _, present = put(alloc, cache, [1, 2, 3, 4, 5, 6])
    assert present == 6 and cache.match_prefix([1, 2, 3, 4, 5, 6])[0] == first, (
        "tree keeps its own pages"
    )
    _, present = put(alloc, cache, [1, 2, 3, 4])
    assert present == 4
    more, present = put(alloc, cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert present == 6 and cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])[0] == first + more[3:]
    assert cache.total_pages() == 4
    assert_partition(alloc, cache)
    cache.check_integrity()


def test_disable_mode():
    alloc, cache = make(page_size=2, disable=True)
    pages = alloc.alloc(2)
    assert cache.insert([1, 2, 3, 4], pages) == 4, "disabled: caller frees everything as duplicates"
    alloc.free(pages)
    assert cache.match_prefix([1, 2, 3, 4]) == ([], cache.root)
    req = new_req([1, 2, 3], alloc.alloc(3), computed_len=3)
    mem = memory(alloc, cache)
    mem.cache_unfinished(req, req.fill_ids)
    assert req.kv.borrowed_len == 0 and len(req.kv.page_ids) == 3
    mem.cache_finished(req, req.fill_ids)
    assert req.kv.page_ids == [] and alloc.num_free == alloc.num_pages
    assert cache.total_pages() == 0 and cache.evict(3) == 0 and cache.reset()


def new_req(ids, page_ids, computed_len, borrowed_len=0, last_node=None):
    req = Req("r", ids, SamplingParams())
    req.kv.page_ids, req.kv.computed_len, req.kv.borrowed_len, req.kv.last_node = (
        list(page_ids),
        computed_len,
        borrowed_len,
        last_node,
    )
    return req


def test_cache_finished_req_accounting():
    P = 4
    alloc, cache = make(num_pages=16, page_size=P)
    mem = memory(alloc, cache)
    ids = list(range(10))
    r1 = new_req(ids, alloc.alloc(4), computed_len=10)  # 2 full pages, 1 partial, 1 unused
    r2 = new_req(
        ids[:8] + [50, 51, 52], alloc.alloc(3), computed_len=11
    )  # same 8 tokens, computed alone
    r1_pages, r2_pages = list(r1.kv.page_ids), list(r2.kv.page_ids)
    assert_partition(alloc, cache, r1.kv.page_ids + r2.kv.page_ids)
    mem.cache_finished(r1, r1.fill_ids)
    assert (r1.kv.page_ids, r1.kv.computed_len, r1.kv.borrowed_len, r1.kv.last_node) == (
        [],
        0,
        0,
        None,
    )
    assert cache.match_prefix(ids)[0] == r1_pages[:2]
    assert alloc.free_page_set() >= set(r1_pages[2:])
    mem.cache_finished(r2, r2.fill_ids)
    assert set(r2_pages[:2]) <= alloc.free_page_set(), "duplicates of cached pages are freed"
    assert cache.total_pages() == 2 and alloc.num_free == 14
    assert_partition(alloc, cache)
    # a req that borrowed the prefix: borrowed pages stay in the tree, its lock is released
    pages, node = cache.match_prefix(ids[:8] + [60, 61, 62, 63, 64])
    cache.inc_lock_ref(node)
    r3 = new_req(
        ids[:8] + [60, 61, 62, 63, 64],
        pages + alloc.alloc(2),
        computed_len=13,
        borrowed_len=8,
        last_node=node,
    )
    own = r3.kv.page_ids[2:]
    assert cache.protected_pages == 2
    with pytest.raises(ValueError):
        mem.cache_finished(r3, r3.fill_ids[:12])
    mem.cache_finished(r3, r3.fill_ids)
    assert cache.protected_pages == 0 and cache.total_pages() == 3
    assert cache.match_prefix(r3.origin_input_ids)[0] == pages + own[:1]
    assert own[1] in alloc.free_page_set()
    assert_partition(alloc, cache)
    cache.check_integrity()


def test_cache_unfinished_req():
    P = 2
    alloc, cache = make(num_pages=16, page_size=P)
    mem = memory(alloc, cache)
    ids = [1, 2, 3, 4, 5]
    r1 = new_req(ids, alloc.alloc(3), computed_len=5)
    r2 = new_req(ids, alloc.alloc(3), computed_len=5)  # same prompt, prefilled concurrently
    r1_pages, r2_pages = list(r1.kv.page_ids), list(r2.kv.page_ids)
    mem.cache_unfinished(r1, r1.fill_ids)
    assert r1.kv.borrowed_len == 4 and r1.kv.page_ids == r1_pages and depth(r1.kv.last_node) == 4
    assert cache.protected_pages == 2 and cache.evictable_pages == 0
    mem.cache_unfinished(r2, r2.fill_ids)
    assert r2.kv.borrowed_len == 4 and r2.kv.page_ids == r1_pages[:2] + r2_pages[2:], (
        "now borrows the tree's pages"
    )
    assert set(r2_pages[:2]) <= alloc.free_page_set()
    assert r1.kv.last_node.lock_ref == 2
    assert_partition(alloc, cache, r1.kv.page_ids[2:] + r2.kv.page_ids[2:])
    # r1 decodes 3 more tokens into its partial page and a new one, then is cached again
    r1.output_ids = [6, 7, 8]
    r1.kv.page_ids += alloc.alloc(1)
    r1.kv.computed_len = 8
    old_last = r1.kv.last_node
    mem.cache_unfinished(r1, r1.fill_ids)
    assert r1.kv.borrowed_len == 8 and depth(r1.kv.last_node) == 8
    assert old_last.lock_ref == 2 and r1.kv.last_node.lock_ref == 1, (
        "lock moved down, r2 keeps its own"
    )
    assert cache.protected_pages == 4
    assert_partition(alloc, cache, r1.kv.page_ids[4:] + r2.kv.page_ids[2:])
    cache.check_integrity()
    mem.cache_finished(r1, r1.fill_ids)
    mem.cache_finished(r2, r2.fill_ids)
    assert cache.protected_pages == 0 and cache.total_pages() == 4
    assert_partition(alloc, cache)
    cache.check_integrity()
    assert cache.reset() and alloc.num_free == alloc.num_pages and cache.total_pages() == 0


def test_reset_keeps_root_and_pretty_print():
    alloc, cache = make(page_size=2)
    put(alloc, cache, [1, 2, 3, 4])
    root = cache.root
    assert "[1, 2, 3, 4]" in pretty_print(cache)
    assert cache.reset() and cache.root is root and alloc.num_free == alloc.num_pages
    cache.check_integrity()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    seqs=st.lists(st.lists(st.integers(0, 2), max_size=12), max_size=8),
    queries=st.lists(st.lists(st.integers(0, 2), max_size=12), max_size=8),
)
def test_match_equals_longest_common_prefix_of_inserted(page_size, seqs, queries):
    """Without eviction, a match is the longest whole-page common prefix with any inserted sequence."""
    alloc, cache = make(num_pages=128, page_size=page_size)
    for s in seqs:
        put(alloc, cache, s[: len(s) // page_size * page_size])
    for q in queries:
        best = 0
        for s in seqs:
            s = s[: len(s) // page_size * page_size]
            n = 0
            while n < min(len(s), len(q)) and s[n] == q[n]:
                n += 1
            best = max(best, n - n % page_size)
        pages, node = cache.match_prefix(q)
        assert len(pages) * page_size == best == depth(node)
        cache.check_integrity()
    assert_partition(alloc, cache)


# ---- state machine against a naive model -------------------------------------------


def chunk(kind, P):
    """Page-sized token runs that collide often: three differ only in their last token."""
    return [3] * P if kind == 3 else [0] * (P - 1) + [kind]


SEQS = st.tuples(st.lists(st.integers(0, 3), max_size=5), st.lists(st.integers(0, 1), max_size=3))


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.integers(6, 24))
    def setup(self, page_size, num_pages):
        self.P = page_size
        self.alloc, self.cache = make(num_pages, page_size)
        self.mem = memory(self.alloc, self.cache)
        self.content = {}  # page id -> token prefix whose KV it holds
        self.model = {}  # cached whole-page prefix -> stamp of its last match/insert
        self.clock = 0
        self.locks = []  # (node, locked prefix) from raw lock rules
        self.reqs = []

    # -- helpers
    def tokens(self, seq):
        ids = [t for kind in seq[0] for t in chunk(kind, self.P)]
        return ids + seq[1][: self.P - 1]

    def aligned(self, ids):
        return ids[: len(ids) - len(ids) % self.P]

    def model_match(self, ids):
        n = 0
        while n + self.P <= len(ids) and tuple(ids[: n + self.P]) in self.model:
            n += self.P
        return n

    def touch(self, ids, n):
        self.clock += 1
        for end in range(self.P, n + 1, self.P):
            self.model[tuple(ids[:end])] = self.clock

    def write(self, page_ids, ids, first_page):
        for i, p in enumerate(page_ids, start=first_page):
            self.content[p] = tuple(ids[: min((i + 1) * self.P, len(ids))])

    def check_pages(self, page_ids, ids):
        for i, p in enumerate(page_ids):
            assert self.content[p] == tuple(ids[: (i + 1) * self.P]), "page holds other tokens' KV"

    def locked(self):
        held = [prefix for _, prefix in self.locks]
        held += [tuple(r.fill_ids[: r.kv.borrowed_len]) for r in self.reqs]
        return {h[:end] for h in held for end in range(self.P, len(h) + 1, self.P)}

    def tree(self):
        """{prefix: page} read straight from the nodes."""
        out, stack = {}, [(c, ()) for c in self.cache.root.children.values()]
        while stack:
            node, above = stack.pop()
            for j, p in enumerate(node.value):
                out[above + tuple(node.key[: (j + 1) * self.P])] = p
            stack += [(c, above + tuple(node.key)) for c in node.children.values()]
        return out

    def take(self, n):
        pages = self.alloc.alloc(n)
        if pages is None:
            self.evict(n - self.alloc.num_free)
            pages = self.alloc.alloc(n)
        return pages

    # -- rules
    @rule(num_pages=st.integers(0, 8))
    def evict(self, num_pages):
        before, num_evictable = dict(self.model), self.cache.evictable_pages
        num_freed = self.cache.evict(num_pages)
        after = set(self.tree())
        removed = set(before) - after
        assert after <= set(before) and num_freed == len(removed)
        assert min(num_pages, num_evictable) <= num_freed <= num_evictable
        locked = self.locked()
        assert not removed & locked, "evicted a locked page"
        if removed:  # LRU: nothing evicted is newer than a surviving unlocked leaf
            parents = {p[: -self.P] for p in after}
            leaves = [p for p in after if p not in parents and p not in locked]
            assert all(before[p] >= max(before[r] for r in removed) for p in leaves)
        self.model = {p: before[p] for p in after}

    @rule(seq=SEQS)
    def insert(self, seq):
        ids = self.aligned(self.tokens(seq))
        pages = self.take(len(ids) // self.P)
        if pages is None:
            return
        self.write(pages, ids, 0)
        expected = self.model_match(ids)
        present = self.cache.insert(ids, pages)
        assert present == expected
        self.alloc.free(pages[: present // self.P])
        self.touch(ids, len(ids))

    def match(self, ids):
        expected = self.model_match(ids)
        pages, node = self.cache.match_prefix(ids)
        assert len(pages) * self.P == expected == depth(node)
        self.check_pages(pages, ids)
        self.touch(ids, expected)
        return pages, node

    @rule(seq=SEQS)
    def match_only(self, seq):
        self.match(self.tokens(seq))

    @precondition(lambda self: len(self.locks) < 4)
    @rule(seq=SEQS)
    def lock(self, seq):
        ids = self.tokens(seq)
        pages, node = self.match(ids)
        self.cache.inc_lock_ref(node)
        self.locks.append((node, tuple(ids[: len(pages) * self.P])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        node, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.dec_lock_ref(node)

    @rule(go=st.integers(0, 1))
    def reset(self, go):
        if go:  # flush rarely, so trees grow deep enough to split and evict
            return
        assert self.cache.reset() == (not self.locked())
        if not self.locked():
            self.model = {}

    @precondition(lambda self: len(self.reqs) < 4)
    @rule(seq=SEQS, num_extra=st.integers(0, 1))
    def start_req(self, seq, num_extra):
        ids = self.tokens(seq)
        pages, node = self.match(ids)
        self.cache.inc_lock_ref(node)  # before allocating: eviction must not take our prefix
        own = self.take(-(-len(ids) // self.P) - len(pages) + num_extra)
        if own is None:
            self.cache.dec_lock_ref(node)
            return
        self.write(own[: len(own) - num_extra], ids, len(pages))
        req = Req(f"r{self.clock}", ids, SamplingParams())
        req.kv.page_ids, req.kv.computed_len, req.kv.borrowed_len, req.kv.last_node = (
            pages + own,
            len(ids),
            len(pages) * self.P,
            node,
        )
        self.reqs.append(req)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), more=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def extend_req(self, data, more):
        req = self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]
        ids = req.fill_ids + more
        num_needed = -(-len(ids) // self.P) - len(req.kv.page_ids)
        if num_needed > 0:
            own = self.take(num_needed)
            if own is None:
                return
            req.kv.page_ids += own
        req.output_ids += more
        first_own = req.kv.borrowed_len // self.P
        self.write(req.kv.page_ids[first_own : -(-len(ids) // self.P)], ids, first_own)
        req.kv.computed_len = len(ids)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def cache_unfinished(self, data):
        req = self.reqs[data.draw(st.integers(0, len(self.reqs) - 1))]
        ids = req.fill_ids[: req.kv.computed_len]
        aligned = self.aligned(ids)
        self.mem.cache_unfinished(req, ids)
        assert req.kv.borrowed_len == len(aligned) == depth(req.kv.last_node)
        self.check_pages(req.kv.page_ids[: len(aligned) // self.P], ids)
        self.touch(ids, len(aligned))  # the insert
        self.touch(ids, len(aligned))  # the match that finds the tree's pages

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish_req(self, data):
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        ids = req.fill_ids[: req.kv.computed_len]
        self.mem.cache_finished(req, ids)
        assert (req.kv.page_ids, req.kv.computed_len, req.kv.borrowed_len, req.kv.last_node) == (
            [],
            0,
            0,
            None,
        )
        self.touch(ids, len(self.aligned(ids)))

    # -- after every step
    @invariant()
    def consistent(self):
        self.cache.check_integrity()
        tree = self.tree()
        assert set(tree) == set(self.model)
        for prefix, page in tree.items():
            assert self.content[page] == prefix
        own = [p for r in self.reqs for p in r.kv.page_ids[r.kv.borrowed_len // self.P :]]
        free = self.alloc.free_page_set()
        assert len(free) + len(tree) + len(own) == self.alloc.num_pages, (
            "a page leaked or is held twice"
        )
        assert free | set(tree.values()) | set(own) == set(range(self.alloc.num_pages))
        for r in self.reqs:
            fill = r.fill_ids
            assert r.kv.page_ids[: r.kv.borrowed_len // self.P] == [
                tree[tuple(fill[:end])] for end in range(self.P, r.kv.borrowed_len + 1, self.P)
            ]
            assert len(r.kv.page_ids) >= -(-r.kv.computed_len // self.P)
        locked = self.locked()
        assert self.cache.protected_pages == len(locked)
        assert self.cache.evictable_pages == len(tree) - len(locked)

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for node, _ in self.locks:
            self.cache.dec_lock_ref(node)
        for r in self.reqs:
            self.mem.cache_finished(r, r.fill_ids[: r.kv.computed_len])
        self.cache.check_integrity()
        assert self.cache.protected_pages == 0
        assert all(n.lock_ref == 0 for n in self.cache._nodes()), "locks return to zero"
        assert self.cache.reset() and self.alloc.num_free == self.alloc.num_pages


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
