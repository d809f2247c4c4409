"""Admission: which waiting requests start (or resume) this step, and with how much of their prompt.

A request is admitted when its uncached pages plus the decode room every running request is
promised fit in free + evictable memory; nobody overtakes a request that does not fit (arrival
fairness). Admission borrows the longest cached prefix from the radix tree.

One admission step per job: order the candidates (_order), match a request's prefix in the pool and
the second tier (_match), hold it back for a prefill in flight (_must_wait), then ReqMemory.admit
locks the match, checks it fits, loads its tier part back and gives the request its memory (or
refuses, holding nothing); a fork copies its donor's page (_fork), then it is counted
(_count_admission).
"""

from __future__ import annotations

import logging
from typing import Callable

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import schedule_policy as policy
from radixrt.runtime.core.fair_share import FairShare, rows_by_client
from radixrt.runtime.core.lora_slots import LoraSlots
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.req_memory import PrefixMatch, ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.core.sessions import SessionTable
from radixrt.runtime.core.tree_node import TreeNode

log = logging.getLogger(__name__)

ExtendItem = Callable[[Req, int, int, tuple[tuple[int, int], ...]], PlanItem]
"""The scheduler's item builder: (req, target, write_start, page_copies) -> the PlanItem computing
req's KV up to `target` positions, its table row written from write_start, after the page copies."""


def fork_donor(req: Req, running: list[Req], matched_len: int, page_size: int) -> Req | None:
    """A running request with the same prompt whose KV covers all of it but the last token, when
    the tree supplied every whole page of that (matched_len) and a partial page remains: req then
    copies the donor's partial page instead of recomputing its tokens, and computes only the last
    prompt token (for its own logits and seed). This is how the `n` samples of one prompt
    (request/edge.py's expand_n) share its prefill: the first one computes the prompt, the others
    wait for it (shares_inflight_prefix) and fork. The copy is made in the step that admits req,
    before its first write into that page, so no page is ever written by two requests and pages
    need no reference count."""
    prompt = req.origin_input_ids
    last = len(prompt) - 1
    if (
        page_size == 1
        or last % page_size == 0
        or req.output_ids
        or req.admitted
        or wants_prompt_logprobs(req)
        or matched_len != last - last % page_size
    ):
        return None
    for d in running:
        if (
            d.kv.computed_len >= last
            and d.key_offset == req.key_offset  # the same adapter's KV only
            and len(d.origin_input_ids) == len(prompt)
            and d.origin_input_ids == prompt
            and len(d.kv.page_ids) > last // page_size
        ):
            return d
    return None


def waits_to_fork(req: Req, inflight: list[list[int]], page_size: int) -> bool:
    """The same prompt is being prefilled this step: wait one step and fork from it (fork_donor),
    whatever the length of the part still uncached (shares_inflight_prefix waits only for long
    ones)."""
    return page_size > 1 and not req.admitted and req.tree_ids(req.fill_ids) in inflight


def rows_held(running: list[Req]) -> int:
    """Table rows the running requests hold or are promised: one each, a beam search its width
    (counted once, whichever of its beams run)."""
    return sum(rows_by_client(running).values())


def wants_prompt_logprobs(req: Req) -> bool:
    return req.logprob_start >= 0 and not req.output_ids


def match_ids(req: Req) -> list[int]:
    """Tokens the tree may supply: never the last one (its logits are needed), and not the
    prompt positions whose logprobs were asked for (their logits must be computed)."""
    ids = req.fill_ids[:-1]
    if wants_prompt_logprobs(req):
        ids = ids[: max(req.logprob_start - 1, 0)]
    return req.tree_ids(ids)


class Admission:
    def __init__(
        self,
        config: ServerConfig,
        tree: RadixCache,
        memory: ReqMemory,
        stats: SchedulerStats,
        sessions: SessionTable,
        *,
        fork_samples: bool = True,
        lora_slots: LoraSlots | None = None,
        fair: FairShare | None = None,
    ):
        """fork_samples: a request whose prompt a running request has already computed forks from it
        (fork_donor) instead of computing its partial last page again. fair: the step's shares
        across clients and their row rule (fair_share.py; None: neither)."""
        self.config = config
        self.tree = tree
        self.memory = memory
        self.stats = stats
        self.sessions = sessions
        self.fork_samples = fork_samples
        self.lora_slots = lora_slots
        self.fair = fair

    def admit(
        self,
        waiting: list[Req],
        running: list[Req],
        budget: int,
        inflight: list[list[int]],
        extend_item: ExtendItem,
        status: ReqStatus = ReqStatus.RUNNING,
    ) -> list[tuple[Req, PlanItem]]:
        """Move the requests that fit from waiting to running (with `status`: a decode server's
        requests whose KV is to come wait for it instead); their first extend items. inflight holds
        the token lists prefilling this step (a request sharing an uncached prefix with one of them
        waits for it)."""
        ready = [r for r in waiting if r.status is ReqStatus.WAITING]
        if not ready:
            return []
        reserve = policy.decode_reserve_tokens(running)
        held = rows_held(running)  # once per step, then counted up as requests are admitted
        # the step's shares across clients apply to prompts computed here (a decode server's
        # requests whose KV is to come compute none)
        fair = self.fair if status is ReqStatus.RUNNING else None
        items: list[tuple[Req, PlanItem]] = []
        for req in self._order(ready, running):
            if (
                budget <= 0
                or not self._room_to_run(held, len(running), req.rows)
                or not self._lora_slot(req, running)
            ):
                break
            mine = budget if fair is None else fair.budget(req, budget)
            if mine <= 0:
                continue  # its client's share of the step is spent: another client's may go
            match = self._match(req)
            if self._must_wait(req, match.matched_len, inflight):
                continue  # wait for it: then match its pages, or fork from it
            left = self.memory.admit(req, match, mine, reserve)
            if left is None:
                break  # keep arrival fairness: nobody overtakes the request that does not fit
            budget -= mine - left  # a copy back from the second tier costs budget
            target = min(req.seq_len, match.matched_len + left)
            if wants_prompt_logprobs(req):
                req.input_logprobs = req.input_top_logprobs = None  # a resumed prefill rescores
            copies = self._fork(req, running, match)
            if copies:
                target = req.seq_len  # a fork computes only its last prompt token
            computed = req.kv.computed_len  # a fork's copied positions count: never computed here
            self._count_admission(req, match.node, computed)
            waiting.remove(req)
            req.move_to(status)
            running.append(req)
            held += req.rows
            items.append((req, extend_item(req, target, 0, copies)))
            if not copies:  # a fork computes one token: its siblings fork too, not wait
                inflight.append(req.tree_ids(req.fill_ids))
            budget -= target - computed
            if fair is not None:
                fair.spend(req, target - computed)
            reserve += int(req.sampling.max_new_tokens * policy.NEW_TOKEN_RESERVE_RATIO)
        return items

    def make_room(self, waiting: list[Req], running: list[Req]) -> None:
        """Before a step is planned: when every row is taken and the waiting request whose client
        runs the fewest rows cannot start, another client running more rows gives one back
        (fair_share.FairShare.take_row preempts its newest request), as long as that is fair."""
        if self.fair is None or not self.fair.enabled:
            return
        if self._room_to_run(rows_held(running), len(running), 1):
            return  # a row is free: admission's turns decide who takes it
        ready = [r for r in waiting if r.status is ReqStatus.WAITING]
        if not ready:
            return
        rows = rows_by_client(running)
        req = min(ready, key=lambda r: rows.get(r.options.client, 0))  # the first such, if ties
        while not self._room_to_run(rows_held(running), len(running), req.rows):
            if not self.fair.take_row(req, running):
                return

    def _order(self, ready: list[Req], running: list[Req]) -> list[Req]:
        """The candidates in admission order (schedule_policy.order_waiting): with 'lpm', longest
        cached prefix first, matched here for every one of them; fair across the clients of the
        running rows; priority first under --enable-priority-scheduling."""
        match_len: dict[int, int] = {}
        if self.config.schedule_policy == "lpm" and len(ready) <= policy.LPM_MAX_QUEUE:
            for r in ready:
                pages, _ = self.tree.match_prefix(match_ids(r))
                match_len[id(r)] = len(pages) * self.memory.page_size
        running_rows: dict[str | None, int] = {}  # each running row (a beam: one of them) once
        for r in running:
            running_rows[r.options.client] = running_rows.get(r.options.client, 0) + 1
        sign = 0
        if self.config.enable_priority_scheduling:
            sign = -1 if self.config.schedule_low_priority_values_first else 1
        return policy.order_waiting(
            ready, match_len, self.config.schedule_policy, running_rows, sign
        )

    def _room_to_run(self, held: int, num_running: int, width: int) -> bool:
        """Table rows are free for a request of `width` rows (a beam search: all its beams) and the
        running batch stays within --max-running-requests, counting every running beam search at
        its full width (held: rows_held; the rows its beams will fork into are kept for them)."""
        promised = held - num_running  # rows running beam searches have yet to fork into
        rows_free = self.memory.rows.num_free - promised
        return rows_free >= width and held + width <= self.config.max_running_requests

    def _lora_slot(self, req: Req, running: list[Req]) -> bool:
        """A request of an adapter gets the adapter's slot, or waits (False) when all are held."""
        if req.lora is None:
            return True
        req.lora_slot = self.lora_slots.take(req.lora, running)
        return req.lora_slot is not None

    def _match(self, req: Req) -> PrefixMatch:
        """req's cached prefix: in the pool, then in the second tier (none without one)."""
        ids = match_ids(req)
        pages, node = self.tree.match_prefix(ids)
        in_tier = self.tree.match_tier(ids, node, len(pages) * self.memory.page_size)
        return PrefixMatch(pages, node, in_tier, self.memory.page_size)

    def _must_wait(self, req: Req, matched_len: int, inflight: list[list[int]]) -> bool:
        """A prefill in flight this step computes req's uncached prefix (then req matches its pages)
        or its whole prompt (then req forks from it): req waits one step."""
        if policy.shares_inflight_prefix(req.tree_ids(req.fill_ids), matched_len, inflight):
            return True
        return self.fork_samples and waits_to_fork(req, inflight, self.memory.page_size)

    def _fork(self, req: Req, running: list[Req], match: PrefixMatch) -> tuple:
        """The page copy of req forking from a running request's prompt (fork_donor), if forks are
        on and there is a donor; () otherwise."""
        if not self.fork_samples:
            return ()
        donor = fork_donor(req, running, match.matched_len, match.page_size)
        return () if donor is None else (self.memory.fork(req, donor),)

    def _count_admission(self, req: Req, node: TreeNode, computed: int) -> None:
        """On a request's first admission (not a resumption): its prefix hit in the stats, its
        session's figures and the cache view's per-prefix hits."""
        if req.admitted:
            return
        req.admitted = True
        req.cached_tokens = computed
        self.stats.on_admit(len(req.origin_input_ids), computed)
        self.tree.record_hit(node)
        if req.session_key is not None:
            self.sessions.on_admit(req.session_key, len(req.origin_input_ids), computed)
