"""The cache view (core/cache_view.py) against an independent model of the tree (tests/naive_cache_tree.py),
and its summary of a big tree: limits respected, nothing lost from the totals, largest subtrees kept."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_cache_tree import NaiveCacheTree, canonical_view

from radixrt.runtime.cache_tree_text import add_previews, check_view_limits, render_text
from radixrt.runtime.core.cache_view import cache_tree_view
from radixrt.runtime.core.page_allocator import PageAllocator
from radixrt.runtime.core.pins import PinTable
from radixrt.runtime.core.radix_cache import RadixCache


def request(alloc, tree, query, cached_after):
    """What admission and finishing do to the tree: match, count the hit, insert the whole pages."""
    _, node = tree.match_prefix(query)
    tree.record_hit(node)
    aligned = cached_after[: len(cached_after) - len(cached_after) % tree.page_size]
    pages = alloc.alloc(len(aligned) // tree.page_size)
    present = tree.insert(aligned, pages)
    alloc.free(pages[: present // tree.page_size])


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24)


@settings(max_examples=200, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), prompts=st.lists(seqs, min_size=1, max_size=10))
def test_view_matches_naive_model(page_size, prompts):
    alloc = PageAllocator(4096, page_size)
    tree = RadixCache(alloc, page_size)
    naive = NaiveCacheTree(page_size)
    for p in prompts:
        request(alloc, tree, p[:-1], p)
        naive.request(p[:-1], p)
    view = cache_tree_view(tree, [], max_depth=256, max_nodes=10_000)
    assert canonical_view(view["root"]) == naive.canonical()
    assert view["num_nodes"] == len(naive.nodes()) == view["num_nodes_shown"]
    tree.check_integrity()


def walk(node, depth=0):
    yield node, depth
    for c in node["children"]:
        yield from walk(c, depth + 1)


@pytest.mark.parametrize("max_depth,max_nodes", [(1, 10_000), (2, 5), (3, 12), (256, 1), (256, 40)])
def test_big_tree_is_summarised_without_losing_totals(max_depth, max_nodes):
    alloc = PageAllocator(8192, 1)
    tree = RadixCache(alloc, 1)
    for a in range(6):  # a three-level tree of uneven sizes
        for b in range(a + 1):
            for c in range(3):
                ids = [a] * (2 + a) + [10 + b] * (1 + b) + [20 + c] * (5 - c)
                request(alloc, tree, ids[:-1], ids)
    full = cache_tree_view(tree, [], 256, 10_000)
    view = cache_tree_view(tree, [], max_depth, max_nodes)
    assert view["num_nodes"] == full["num_nodes"] and view["num_tokens"] == full["num_tokens"]
    full_by_id = {n["id"]: n for n, _ in walk(full["root"])}
    shown = list(walk(view["root"]))
    assert len(shown) - 1 == view["num_nodes_shown"] <= max_nodes
    assert max(d for _, d in shown) <= max_depth
    for node, _ in shown:
        omitted = node["omitted"] or {"tokens": 0, "nodes": 0}
        kids = sum(c["subtree_tokens"] for c in node["children"])
        assert kids + omitted["tokens"] == node["subtree_tokens"] - node["num_tokens"]
        if node["omitted"] and node["children"]:  # the largest subtrees are the ones kept
            sizes = sorted(
                (c["subtree_tokens"] for c in full_by_id[node["id"]]["children"]), reverse=True
            )
            assert (
                sorted((c["subtree_tokens"] for c in node["children"]), reverse=True)
                == sizes[: len(node["children"])]
            )
    assert view["root"]["subtree_tokens"] == full["num_tokens"]


def test_pins_locks_and_previews():
    alloc = PageAllocator(256, 1)
    tree = RadixCache(alloc, 1)
    request(alloc, tree, [1, 2, 3], [1, 2, 3, 4])
    request(alloc, tree, [1, 2, 5], [1, 2, 5, 6])
    pins = PinTable(tree, 256)
    handle = pins.pin([1, 2, 3, 4], ttl_s=60)
    ((pinned_node, _),) = pins.pinned_nodes()
    view = cache_tree_view(tree, [(pinned_node, "chat-7")])
    (shared,) = view["root"]["children"]
    assert shared["sessions"] == ["chat-7"]
    assert (shared["num_tokens"], shared["pins"], shared["lock_ref"]) == (2, 1, 1)
    pinned_leaf = next(c for c in shared["children"] if c["pins"])
    other = next(c for c in shared["children"] if not c["pins"])
    assert pinned_leaf["num_tokens"] == 2 and other["lock_ref"] == 0

    class Tok:
        def decode(self, ids, skip_special_tokens):
            return "".join(chr(ord("a") + i) for i in ids)

    add_previews(view, Tok())
    assert shared["text"] == "bc" and "preview_ids" not in shared
    assert "pinned×1" in render_text(view)
    pins.unpin(handle)
    assert cache_tree_view(tree, [])["root"]["children"][0]["pins"] == 0


@pytest.mark.parametrize(
    "depth,nodes,field",
    [
        (0, 5, "max_depth"),
        (5, 0, "max_nodes"),
        ("3", 5, "max_depth"),
        (True, 5, "max_depth"),
        (5, 10**6, "max_nodes"),
    ],
)
def test_limits_are_checked_by_name(depth, nodes, field):
    with pytest.raises(ValueError, match=field):
        check_view_limits(depth, nodes)
