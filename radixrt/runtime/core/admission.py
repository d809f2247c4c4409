"""Admission: which waiting requests start (or resume) this step, and with how much of their prompt.

A request is admitted when its uncached pages plus the decode room every running request is
promised fit in free + evictable memory; nobody overtakes a request that does not fit (arrival
fairness). Admission borrows the longest cached prefix from the radix tree.
"""
from __future__ import annotations

import logging
from typing import Callable

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import schedule_policy as policy
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.core.sessions import SessionTable


log = logging.getLogger(__name__)


def wants_prompt_logprobs(req: Req) -> bool:
    return req.logprob_start_len >= 0 and not req.output_ids


def match_ids(req: Req) -> list[int]:
    """Tokens the tree may supply: never the last one (its logits are needed), and not the
    prompt positions whose logprobs were asked for (their logits must be computed)."""
    ids = req.fill_ids[:-1]
    if wants_prompt_logprobs(req):
        ids = ids[:max(req.logprob_start_len - 1, 0)]
    return ids


class Admission:
    def __init__(self, config: ServerConfig, tree: RadixCache, memory: ReqMemory, stats: SchedulerStats,
                 sessions: SessionTable):
        self.config = config
        self.tree = tree
        self.memory = memory
        self.stats = stats
        self.sessions = sessions

    def admit(self, waiting: list[Req], running: list[Req], budget: int, inflight: list[list[int]],
              extend_item) -> list[tuple[Req, PlanItem]]:
        """Move the requests that fit from waiting to running; their first extend items.
        extend_item(req, target, write_start) builds an item; inflight holds the token lists
        prefilling this step (a request sharing an uncached prefix with one of them waits for it)."""
        ready = [r for r in waiting if r.grammar_future is None]
        if not ready:
            return []
        page_size = self.memory.page_size
        allocator = self.memory.allocator
        match_len: dict[int, int] = {}
        if self.config.schedule_policy == "lpm" and len(ready) <= policy.LPM_MAX_QUEUE:
            for r in ready:
                match_len[id(r)] = len(self.tree.match_prefix(match_ids(r))[0]) * page_size
        reserve = policy.decode_reserve_tokens(running)
        items: list[tuple[Req, PlanItem]] = []
        for req in policy.order_waiting(ready, match_len, self.config.schedule_policy):
            if budget <= 0 or not self.memory.rows.num_free or len(running) >= self.config.max_running_requests:
                break
            ids = req.fill_ids
            pages, node = self.tree.match_prefix(match_ids(req))
            cached = len(pages) * page_size
            if policy.shares_inflight_prefix(ids, cached, inflight):
                continue
            target = min(len(ids), cached + budget)
            self.tree.inc_lock_ref(node)
            need = allocator.pages_for(target) - len(pages)
            if need + allocator.pages_for(reserve) > allocator.num_free + self.tree.evictable_pages:
                self.tree.dec_lock_ref(node)
                break  # keep arrival fairness: nobody overtakes the request that does not fit
            self.memory.take(req, pages, node)
            if wants_prompt_logprobs(req):
                req.input_logprobs = req.input_top_logprobs = None  # a resumed prefill scores them anew
            if not self.memory.grow(req, target):  # cannot fail: counted above
                raise AssertionError("admission accounting is wrong")
            if not req.admitted:
                req.admitted = True
                req.prefix_hit_len = cached
                self.stats.on_admit(len(req.origin_input_ids), cached)
                self.tree.record_hit(node)  # the cache view's per-prefix hits, once per request
                if req.session_id is not None:
                    self.sessions.on_admit(req.session_id, len(req.origin_input_ids), cached)
            waiting.remove(req)
            running.append(req)
            items.append((req, extend_item(req, target, 0)))
            inflight.append(ids)
            budget -= target - cached
            reserve += int(req.sampling.max_new_tokens * policy.NEW_TOKEN_RESERVE_RATIO)
        return items

    @staticmethod
    def collect_grammars(waiting: list[Req], check_fault: Callable, fail: Callable) -> None:
        """Waiting requests whose grammar compile finished get it (then they can be admitted), or fail
        alone: 400 when the grammar was refused (a ValueError), 500 for anything else."""
        for req in list(waiting):
            fut = req.grammar_future
            if fut is None or not fut.done():
                continue
            req.grammar_future = None
            try:
                check_fault("grammar", req.origin_input_ids)
                req.grammar = fut.result()
            except Exception as e:
                waiting.remove(req)
                if isinstance(e, ValueError):
                    fail(req, str(e), 400, f"invalid constraint: {e}")
                else:
                    log.exception("collecting the grammar of %s failed", req.rid)
                    fail(req, f"internal error: {type(e).__name__}: {e}", 500)
