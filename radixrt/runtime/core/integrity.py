"""The scheduler's invariant, checked when idle and after every test that touches the pool: every
page is exactly one of free, held by the tree, owned by a request holding memory; every table row
is free or held by exactly one such request; each request's status matches what it holds."""

from __future__ import annotations

from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.req_memory import ReqMemory

HOLDING = (ReqStatus.RUNNING, ReqStatus.SENDING, ReqStatus.WAITING_FOR_KV)
QUEUED = (ReqStatus.WAITING, ReqStatus.WAITING_FOR_GRAMMAR)


def check_integrity(
    memory: ReqMemory, holding: list[Req], waiting: list[Req], num_pins: int
) -> None:
    """holding: the running requests and those a KV role holds; AssertionError naming what broke."""
    tree, allocator, page_size = memory.tree, memory.allocator, memory.page_size
    tree.check_integrity()
    free = allocator.free_page_set()
    assert len(free) == allocator.num_free, "a page is on the free list twice"
    tree_pages = tree.all_page_ids()
    assert len(set(tree_pages)) == len(tree_pages), "a page is in the tree twice"
    owned: list[int] = []
    for r in holding:
        kv = r.kv
        num_borrowed = kv.borrowed_len // page_size
        assert r.status in HOLDING, f"{r} holds memory"
        assert kv.table_row is not None, f"{r} runs without a table row"
        assert kv.borrowed_len <= kv.computed_len <= r.seq_len, f"{r}: lengths out of order"
        assert len(kv.page_ids) * page_size >= kv.computed_len, f"{r}: pages do not cover its KV"
        assert set(kv.page_ids[:num_borrowed]) <= set(tree_pages), (
            f"{r}: borrowed pages not in the tree"
        )
        owned.extend(kv.page_ids[num_borrowed:])
    for r in waiting:
        assert r.status in QUEUED, f"{r} is in the waiting queue"
        assert not r.kv.page_ids and r.kv.table_row is None, f"waiting {r} holds memory"
    assert len(set(owned)) == len(owned), "two running requests own the same page"
    all_pages = free | set(tree_pages) | set(owned)
    assert len(free) + len(tree_pages) + len(owned) == allocator.num_pages == len(all_pages), (
        f"pages leaked or shared: free {len(free)} + tree {len(tree_pages)} "
        f"+ owned {len(owned)} != {allocator.num_pages} (distinct {len(all_pages)})"
    )
    if not holding and not num_pins:
        assert tree.protected_pages == 0, "locks remain with nothing running or pinned"
    rows = [r.kv.table_row for r in holding]
    free_rows = memory.rows.free_set()
    assert len(set(rows)) == len(rows) and not set(rows) & free_rows, "table rows shared"
    assert len(rows) + len(free_rows) == memory.rows.num_rows, "a table row leaked"
