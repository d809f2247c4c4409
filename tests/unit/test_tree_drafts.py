"""#57: drafts from the radix tree (core/tree_drafts.py). Truth: the set of token lists inserted,
kept beside the tree (a naive model): a continuation is always what some inserted list holds after
the ids, as long as the limit or that list allows, and the walk changes nothing in the tree."""

from __future__ import annotations

import random

import pytest

from radixrt.runtime.core.page_allocator import PageAllocator
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.tree_drafts import cached_len, continuation


def build(page_size: int, rng: random.Random, n: int = 12):
    tree = RadixCache(PageAllocator(4096, page_size), page_size)
    seqs = []
    base = [rng.randint(1, 6) for _ in range(page_size * 3)]
    for _ in range(n):
        cut = rng.randint(0, len(base))
        seq = base[:cut] + [rng.randint(1, 6) for _ in range(rng.randint(1, 5) * page_size)]
        seq = seq[: len(seq) - len(seq) % page_size]
        if not seq:
            continue
        pages = tree.allocator.alloc(len(seq) // page_size)
        present = tree.insert(seq, pages)
        tree.allocator.free(pages[: present // page_size])  # the tree kept its own for these
        seqs.append(seq)
    return tree, seqs


def shape(tree: RadixCache) -> list:
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append((tuple(node.key), node.last_access, node.hits, len(node.children)))
        stack.extend(node.children.values())
    return sorted(out)


@pytest.mark.parametrize("page_size", [1, 4])
def test_continuations_are_what_an_inserted_list_holds_after_the_ids(page_size):
    rng = random.Random(page_size)
    for _ in range(40):
        tree, seqs = build(page_size, rng)
        before, clock = shape(tree), tree._clock
        for _ in range(30):
            src = rng.choice(seqs)
            ids = src[: rng.randint(1, len(src))] if rng.random() < 0.8 else [9, 9]
            limit = rng.randint(1, 8)
            got = continuation(tree, ids, limit)
            extending = [s for s in seqs if s[: len(ids)] == ids]
            if not extending:
                assert got == [], (ids, got)
                continue
            whole = ids + got
            assert any(s[: len(whole)] == whole for s in extending), (ids, got)
            # as long as the limit allows, or until no inserted list goes further
            assert len(got) == limit or not any(len(s) > len(whole) and s[: len(whole)] == whole
                                                for s in seqs), (ids, got)  # fmt: skip
        assert shape(tree) == before and tree._clock == clock  # read-only


def test_at_a_branch_the_continuation_most_requests_ran_through_wins():
    tree = RadixCache(PageAllocator(64, 1), 1)
    common = [1, 2, 3]
    for tail in ([4, 5, 6], [7, 8, 9]):
        tree.insert(common + tail, tree.allocator.alloc(6))
    assert continuation(tree, common, 3) == [7, 8, 9]  # no hits yet: the most recent
    _, node = tree.match_prefix(common + [4, 5, 6])
    tree.record_hit(node)
    assert continuation(tree, common, 3) == [4, 5, 6]
    assert continuation(tree, [1, 2], 2) == [3, 4]
    assert continuation(tree, common + [4], 9) == [5, 6]  # the list's end
    assert continuation(tree, [2], 3) == []  # not a prefix of anything held


@pytest.mark.parametrize("page_size", [1, 4])
def test_cached_len_is_the_longest_inserted_whole_page_prefix_and_changes_nothing(page_size):
    rng = random.Random(10 + page_size)
    for _ in range(40):
        tree, seqs = build(page_size, rng)
        before, clock = shape(tree), tree._clock
        for _ in range(30):
            src = rng.choice(seqs)
            ids = src[: rng.randint(0, len(src))] + [rng.randint(1, 9) for _ in range(3)]
            want = max(  # the naive model: the longest common whole-page prefix with any list
                (n - n % page_size for n in (common(s, ids) for s in seqs)), default=0
            )
            assert cached_len(tree, ids) == want, (ids, want)
        assert shape(tree) == before and tree._clock == clock  # no split, no LRU stamp


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
