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


# A request whose prompt another running request has already computed forks from it (see fork_donor).
FORK_SAMPLES = True


def fork_donor(req: Req, running: list[Req], cached: int, page_size: int) -> Req | None:
    """A running request with the same prompt whose KV covers all of it but the last token, when the tree
    supplied every whole page of that (cached) and a partial page remains: req then copies the donor's
    partial page instead of recomputing its tokens, and computes only the last prompt token (for its own
    logits and seed). This is how the `n` samples of one prompt (request_edge.expand_n) share its prefill:
    the first one computes the prompt, the others wait for it (shares_inflight_prefix) and fork. The copy
    is made in the step that admits req, before its first write into that page, so no page is ever written
    by two requests and pages need no reference count."""
    prompt = req.origin_input_ids
    last = len(prompt) - 1
    if (
        not FORK_SAMPLES
        or page_size == 1
        or last % page_size == 0
        or req.output_ids
        or req.admitted
        or wants_prompt_logprobs(req)
        or cached != last - last % page_size
    ):
        return None
    for d in running:
        if (
            d.kv_len >= last
            and len(d.origin_input_ids) == len(prompt)
            and d.origin_input_ids == prompt
            and len(d.page_ids) > last // page_size
        ):
            return d
    return None


def waits_to_fork(req: Req, inflight: list[list[int]], page_size: int) -> bool:
    """The same prompt is being prefilled this step: wait one step and fork from it (fork_donor), whatever
    the length of the part still uncached (shares_inflight_prefix waits only for long ones)."""
    return FORK_SAMPLES and page_size > 1 and not req.admitted and req.fill_ids in inflight


def wants_prompt_logprobs(req: Req) -> bool:
    return req.logprob_start_len >= 0 and not req.output_ids


def match_ids(req: Req) -> list[int]:
    """Tokens the tree may supply: never the last one (its logits are needed), and not the
    prompt positions whose logprobs were asked for (their logits must be computed)."""
    ids = req.fill_ids[:-1]
    if wants_prompt_logprobs(req):
        ids = ids[: max(req.logprob_start_len - 1, 0)]
    return ids


class Admission:
    def __init__(
        self,
        config: ServerConfig,
        tree: RadixCache,
        memory: ReqMemory,
        stats: SchedulerStats,
        sessions: SessionTable,
    ):
        self.config = config
        self.tree = tree
        self.memory = memory
        self.stats = stats
        self.sessions = sessions

    def admit(
        self,
        waiting: list[Req],
        running: list[Req],
        budget: int,
        inflight: list[list[int]],
        extend_item,
    ) -> list[tuple[Req, PlanItem]]:
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
            if (
                budget <= 0
                or not self.memory.rows.num_free
                or len(running) >= self.config.max_running_requests
            ):
                break
            ids = req.fill_ids
            pages, node = self.tree.match_prefix(match_ids(req))
            in_tier = self.tree.match_tier(
                match_ids(req), node, len(pages) * page_size
            )  # second tier, if any
            cached = (len(pages) + sum(len(n.host_value) for n in in_tier)) * page_size
            if policy.shares_inflight_prefix(ids, cached, inflight) or waits_to_fork(
                req, inflight, page_size
            ):
                continue  # wait for it: then match its pages, or fork from it
            target = min(len(ids), cached + budget)
            self.tree.inc_lock_ref(node)
            need = allocator.pages_for(target) - len(
                pages
            )  # the pages loaded back from the tier included
            if need + allocator.pages_for(reserve) > allocator.num_free + self.tree.evictable_pages:
                self.tree.dec_lock_ref(node)
                break  # keep arrival fairness: nobody overtakes the request that does not fit
            if in_tier:
                pages, node, budget = self._load_back(in_tier, pages, node, budget)
                cached = len(pages) * page_size
                target = min(len(ids), cached + budget)
            donor = fork_donor(req, running, cached, page_size)
            self.memory.take(req, pages, node)
            if wants_prompt_logprobs(req):
                req.input_logprobs = req.input_top_logprobs = (
                    None  # a resumed prefill scores them anew
                )
            if not self.memory.grow(req, target):  # cannot fail: counted above
                raise AssertionError("admission accounting is wrong")
            copies = []
            if donor is not None:
                page = (len(ids) - 1) // page_size
                copies = [(donor.page_ids[page], req.page_ids[page])]
                req.kv_len = cached = (
                    len(ids) - 1
                )  # the copied positions count as cached: never computed here
                target = len(ids)
            if not req.admitted:
                req.admitted = True
                req.prefix_hit_len = cached
                self.stats.on_admit(len(req.origin_input_ids), cached)
                self.tree.record_hit(node)  # the cache view's per-prefix hits, once per request
                if req.session_id is not None:
                    self.sessions.on_admit(req.session_id, len(req.origin_input_ids), cached)
            waiting.remove(req)
            running.append(req)
            item = extend_item(req, target, 0, copies)
            items.append((req, item))
            if (
                donor is None
            ):  # a fork computes one token: its siblings need not wait for it, they fork too
                inflight.append(ids)
            budget -= target - cached
            reserve += int(req.sampling.max_new_tokens * policy.NEW_TOKEN_RESERVE_RATIO)
        return items

    def _load_back(
        self, in_tier: list, pages: list[int], node, budget: int
    ) -> tuple[list[int], object, int]:
        """Copy a match's tier-only nodes back into the pool (one batched copy); the lock moves to the last
        node loaded. The copy counts in the step's budget at policy.TIER_LOAD_TOKENS_PER_BUDGET_TOKEN."""
        loaded, last = self.tree.load_back(in_tier)
        if last is None:  # nothing came back (a corrupt first page): recompute it
            return pages, node, budget
        self.tree.inc_lock_ref(last)  # lock the longer path before unlocking the old one
        self.tree.dec_lock_ref(node)
        cost = len(loaded) * self.memory.page_size // policy.TIER_LOAD_TOKENS_PER_BUDGET_TOKEN
        return pages + loaded, last, max(budget - cost, 1)

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
