"""Counters the scheduler keeps, the live figures it reports, and its integrity check.

The functions take the Scheduler as `s` and read only its public state (no import of it: no cycle)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.core.req import Req


@dataclass
class SchedulerStats:
    num_forwards: int = 0
    num_preemptions: int = 0
    num_admitted: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    num_draft_tokens: int = 0  # jump-forward draft tokens fed for verification
    num_draft_accepted: int = 0  # of those, the ones the model's pick agreed with
    num_step_failures: int = (
        0  # forwards that raised (their culprit requests failed, the rest went on)
    )
    integrity_error: str | None = None  # the last integrity walk's finding (None: it held)
    integrity_checked_at: float = 0.0  # time.time() of that walk (0: never)

    def on_admit(self, prompt_len: int, cached_len: int) -> None:
        self.num_admitted += 1
        self.prompt_tokens += prompt_len
        self.cached_tokens += cached_len

    def on_finish(self, req: Req) -> None:
        self.num_finished += 1
        self.generated_tokens += len(req.output_ids)
        if req.finished_reason and req.finished_reason.get("type") == "abort":
            self.num_aborted += 1


def server_info(s: Any, walk: bool = True) -> dict:
    """The live figures of scheduler `s`: counters, plus the integrity walk's result (walk: run it now;
    otherwise the last one's, with its time)."""
    st = s.stats
    if walk:
        try:
            check_integrity(s)
            st.integrity_error = None
        except AssertionError as e:
            st.integrity_error = str(e) or "integrity check failed"
        st.integrity_checked_at = time.time()
    return {
        "integrity_ok": st.integrity_error is None,
        "integrity_error": st.integrity_error,
        "integrity_checked_at": st.integrity_checked_at,
        "kv_pages_total": s.allocator.num_pages,
        "kv_pages_free": s.allocator.num_free,
        "kv_pages_evictable": s.tree.evictable_pages,
        "kv_pages_cached": s.tree.total_pages(),
        "page_size": s.page_size,
        "max_total_tokens": s.pool_tokens,
        "kv_bytes_per_token": getattr(s.runner, "kv_bytes_per_token", None),
        "kv_pool_bytes": getattr(s.runner, "kv_pool_bytes", None),
        "kv_cache_dtype": str(getattr(s.runner, "kv_dtype", "")).removeprefix("torch.") or None,
        "num_running": len(s.running),
        "num_waiting": len(s.waiting),
        "num_preemptions": st.num_preemptions,
        "num_pins": len(s.pins),
        "num_pinned_tokens": s.pins.num_pinned_tokens,
        **s.sessions.info(),
        "num_requests_admitted": st.num_admitted,
        "num_requests_finished": st.num_finished,
        "num_requests_aborted": st.num_aborted,
        "prompt_tokens": st.prompt_tokens,
        "cached_tokens": st.cached_tokens,
        "generated_tokens": st.generated_tokens,
        "cache_hit_rate": st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
        "jump_forward_draft_tokens": st.num_draft_tokens,
        "jump_forward_accepted_tokens": st.num_draft_accepted,
        "num_step_failures": st.num_step_failures,
        **s.tree.tier_info(),  # the second tier's figures (tiered_cache.py)
    }


def check_integrity(s: Any) -> None:
    """Every page is exactly one of: free, held by the tree, owned by a running request; every
    table row is free or held by exactly one running request."""
    s.tree.check_integrity()
    free = s.allocator.free_page_set()
    assert len(free) == s.allocator.num_free, "a page is on the free list twice"
    tree_pages = s.tree.all_page_ids()
    assert len(set(tree_pages)) == len(tree_pages), "a page is in the tree twice"
    owned: list[int] = []
    for r in s.running:
        num_borrowed = r.cached_len // s.page_size
        assert r.table_row is not None, f"{r} runs without a table row"
        assert r.cached_len <= r.kv_len <= r.seq_len, f"{r}: lengths out of order"
        assert len(r.page_ids) * s.page_size >= r.kv_len, f"{r}: pages do not cover its KV"
        assert set(r.page_ids[:num_borrowed]) <= set(tree_pages), (
            f"{r}: borrowed pages not in the tree"
        )
        owned.extend(r.page_ids[num_borrowed:])
    for r in s.waiting:
        assert not r.page_ids and r.table_row is None, f"waiting {r} holds memory"
    assert len(set(owned)) == len(owned), "two running requests own the same page"
    all_pages = free | set(tree_pages) | set(owned)
    assert len(free) + len(tree_pages) + len(owned) == s.allocator.num_pages == len(all_pages), (
        f"pages leaked or shared: free {len(free)} + tree {len(tree_pages)} + owned {len(owned)} "
        f"!= {s.allocator.num_pages} (distinct {len(all_pages)})"
    )
    if not s.running and not len(s.pins):
        assert s.tree.protected_pages == 0, "locks remain with nothing running or pinned"
    rows = [r.table_row for r in s.running]
    free_rows = s.memory.rows.free_set()
    assert len(set(rows)) == len(rows) and not set(rows) & free_rows, "table rows shared"
    assert len(rows) + len(free_rows) == s.memory.rows.num_rows, "a table row leaked"
