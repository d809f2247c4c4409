"""The event loop's body: one step plans, runs, applies, finishes and preempts. No tensors here.

`step()` plans one forward over a mixed batch (a StepPlan: decode requests first, then decodes
that carry a jump-forward draft to verify, then extends: prefill chunks, resumed requests), hands
its items (plain data, core/plan.py) to the model runner and applies the sampled tokens; every
output waits in take_outputs(). The scheduler is composed of collaborators, each called with what
it needs: intake.py (a message becomes a Req), Admission (who starts), ReqMemory (every page move),
ItemBuilder (a request's part of the step), BeamSearches, the KV role (kv_roles.py: unified, or a
prefill/decode half of disaggregation), step_recovery.py, and the admin facade (scheduler_admin.py).
A request's status (req.py's ReqStatus) changes only here, in admission, intake's grammar wait and
the beam searches.

LONG_FILE: one step's phases (intake, plan, run, apply, finish, preempt) read as one, in order.
"""

from __future__ import annotations

import logging
import time

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import schedule_policy as policy
from radixrt.runtime.core.admission import Admission, match_ids
from radixrt.runtime.core.beam_searches import BeamSearches
from radixrt.runtime.core.draft_lengths import cut_drafts
from radixrt.runtime.core.drafts import next_draft, take_draft
from radixrt.runtime.core.fair_share import FairShare
from radixrt.runtime.core.faults import FaultInjector
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.intake import (
    GrammarBackend,
    GrammarBackends,
    check_queue,
    collect_grammars,
    new_req,
    refusal,
)
from radixrt.runtime.core.integrity import check_integrity
from radixrt.runtime.core.kv_roles import TransferDone
from radixrt.runtime.core.kv_roles_pd import make_role
from radixrt.runtime.core.kv_transfer import KVTransfer
from radixrt.runtime.core.lora_slots import LoraSlots
from radixrt.runtime.core.namespaces import TreeNamespaces
from radixrt.runtime.core.outbox import Outbox
from radixrt.runtime.core.page_allocator import PageAllocator, TableRows
from radixrt.runtime.core.pins import PinTable
from radixrt.runtime.core.plan import ItemResult, PlanItem, Runner, StepPlan
from radixrt.runtime.core.plan_items import ItemBuilder
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.req_finish import apply_prompt_logprobs, apply_sampled_token
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_admin import SchedulerAdmin
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.core.sessions import SessionTable
from radixrt.runtime.core.step_recovery import recover
from radixrt.runtime.core.tiered_cache import make_tree
from radixrt.runtime.core.tree_drafts import cached_len
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.edge import EdgeRules, constraint_of
from radixrt.runtime.request.prompt_checks import EdgeLimits

log = logging.getLogger(__name__)
ABORTED = FinishReason.abort("aborted by the client")
RUNNING, FINISHED = ReqStatus.RUNNING, ReqStatus.FINISHED  # (the step's hot loops test these)


class Scheduler:
    def __init__(
        self,
        config: ServerConfig,
        runner: Runner,
        grammar_backends: GrammarBackends | None = None,
        kv_transfer: KVTransfer | None = None,
    ):
        """runner: model/model_runner.ModelRunner (engine/scheduler_factory.py builds both) or a
        test's fake. grammar_backends: constrained/choose.py's BackendChooser (None: constraints
        are refused). kv_transfer: the KV transfer of --disaggregation-mode prefill|decode."""
        self.config, self.runner, self.tokenizer = config, runner, runner.tokenizer
        allocator = PageAllocator(runner.num_pages, config.page_size)
        self.tree = make_tree(config, allocator, runner)  # a TieredRadixCache with a tier
        self.memory = ReqMemory(allocator, self.tree, TableRows(runner.max_rows))
        max_running = min(config.max_running_requests, runner.max_rows)
        pool_tokens = runner.num_pages * config.page_size
        self.limits = EdgeLimits(
            runner.vocab_size, runner.context_length, pool_tokens, max_running, config.page_size
        )
        self.eos_ids = set(runner.eos_token_ids)
        self.waiting: list[Req] = []  # WAITING_FOR_GRAMMAR or WAITING, in arrival order
        self.running: list[Req] = []  # RUNNING
        self.outbox = Outbox()
        self.stats = SchedulerStats()
        self.faults = FaultInjector()
        self.pins = PinTable(self.tree, pool_tokens)
        self.sessions = SessionTable(self.pins, config.session_ttl)
        self.lora_slots = LoraSlots(config.max_loras_per_batch)
        self.namespaces = TreeNamespaces()  # the tree's (adapter, cache_salt) namespaces
        self.role = make_role(config.disaggregation_mode, kv_transfer, config.page_size, self.stats)
        self.kv_transfer = kv_transfer  # its event socket wakes the serving loop
        self.beams = BeamSearches(self.memory, self.outbox, self.stats, self.eos_ids)
        self.fair = FairShare(
            not config.disable_fair_share, self.preempt, config.chunked_prefill_size, self._cached
        )
        self.admission = Admission(
            config,
            self.tree,
            self.memory,
            self.stats,
            self.sessions,
            fork_samples=self.role.computes_prompts,
            lora_slots=self.lora_slots,
            fair=self.fair,
        )
        self.grammar_backends = grammar_backends
        # (faults looked up at each call: a test swaps the injector)
        self.items = ItemBuilder(
            self.memory, sorted(self.eos_ids), lambda *a: self.faults.check(*a)
        )
        self.admin = SchedulerAdmin(self)
        self.model_info = {
            "model_path": runner.model_path,
            "context_length": runner.context_length,
            "vocab_size": runner.vocab_size,
            "eos_token_ids": sorted(self.eos_ids),
            "is_generation": True,
            "dtype": runner.dtype_name,
        }

    # ---------------------------------------------------------------- intake
    @property
    def edge_rules(self) -> EdgeRules:
        """What a request must meet here (request/edge.py): intake's and the Engine's checks."""
        return EdgeRules(self.limits, self.runner.lora_names(), self.config.disaggregation_mode)

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        """Queue a request; anything wrong with it (or any failure taking it in) ends it alone, its
        refusal in take_outputs()."""
        try:
            req = new_req(msg, self.edge_rules, self.tokenizer, self.faults.check)
            self.role.intake(req, self.running, self.waiting)
            check_queue(len(self.waiting) + len(self.running), self.config)
            req.key_offset = self.namespaces.key_offset(req.lora, req.options.cache_salt)
            constraint = constraint_of(req.sampling)
            if constraint is not None:
                future = self.grammar_backend(constraint[0]).request(*constraint)
                if req.options.reasoning_end_ids is not None:  # the answer after the thinking
                    future = self.grammar_backends.after_reasoning(
                        future, req.options.reasoning_end_ids
                    )
                req.wait_for_grammar(future)
            if req.sampling.is_beam:
                self.beams.start(req)
            self.waiting.append(req)
        except Exception as e:  # ValueError: refused; anything else: our bug, still only this one's
            if not isinstance(e, (ValueError, TypeError)):
                log.exception("intake of %s failed", msg.rid)
            self.waiting = [r for r in self.waiting if r.rid != msg.rid]
            self.beams.groups.pop(msg.rid, None)
            self.role.refused(msg.options.bootstrap, e)
            self.outbox.put(refusal(msg.rid, len(msg.input_ids), e))

    def refuse(self, rid: str, error: Exception) -> None:
        """Answer a request that could not be read (messages.MalformedRequest): refused, a 400."""
        self.outbox.put(refusal(rid, 0, error))

    def grammar_backend(self, kind: str = "regex") -> GrammarBackend:
        """The grammar backend for constraints of `kind` (--grammar-backend; ebnf: llguidance)."""
        if self.grammar_backends is None:
            raise ValueError("this scheduler was built without grammar backends: no constraints")
        return self.grammar_backends.for_kind(kind)

    def abort(self, rid: str) -> None:
        """End request rid (its abort in take_outputs()); one whose KV is in flight ends once the
        transfer lets go of its pages."""
        self.role.abort(rid)
        if rid in self.beams.groups:
            self.beams.end(self.beams.groups[rid], self.running, self.waiting, ABORTED)
        for req in [r for r in self.waiting if r.rid == rid]:
            self.waiting.remove(req)
            self.finish(req, ABORTED)
        for req in [r for r in self.running if r.rid == rid]:
            self.finish(req, ABORTED)

    # ---------------------------------------------------------------- the step
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> bool:
        """Plan one step and run its forward; True when a forward ran."""
        if self.pins.expire():  # sessions whose pin lapsed end with it
            self.sessions.expire()
        for req, error, status, reason in collect_grammars(self.waiting, self.faults.check):
            self.fail(req, error, status, reason)
        plan = self._plan()
        if not plan:
            return False
        self.stats.num_forwards += 1
        try:
            started = time.perf_counter()
            results = self.runner.run(plan.items, plan.mask_sources)
            tokens = sum(len(item.new_ids) for item in plan.items)
            extends = not all(req.is_decoding for req in plan.reqs)  # (applied below: as planned)
            verifies = any(item.num_draft for item in plan.items)
            self.fair.record(tokens, time.perf_counter() - started, extends, verifies)
            if self.faults.enabled:  # off in production: no per-step work
                self.faults.check_plan([req.origin_input_ids for req in plan.reqs])
        except Exception as e:
            for req, error, status in recover(plan.reqs, e, self.memory, self.stats):
                if not req.finished:  # a beam's failure ends its whole search, siblings included
                    self.fail(req, error, status)
            self.check_integrity()  # a broken invariant after a failed step propagates
            return True
        finally:
            plan.mask_sources.clear()  # live grammar states: not kept past the step
        self._apply(plan, results)
        return True

    def take_outputs(self) -> list[TokenOut]:
        """The deltas, finishes and refusals produced since the last call."""
        return self.outbox.drain()

    def poll_transfers(self) -> bool:
        """Apply the KV role's finished transfers; True when there were any."""
        done = self.role.poll()
        for d in done:
            try:
                self._transfer_done(d)
            except Exception:  # one request's bookkeeping must not stop the others'
                log.exception("applying the end of %s's transfer failed", d.req.rid)
        return bool(done)

    def _plan(self) -> StepPlan:
        plan = StepPlan()
        if self.role.rows_all_running:
            self.admission.make_room(self.waiting, self.running)  # a row back from a flood
        self.fair.plan(self.running, self.waiting)  # each client's share of the step (if shared)
        self._plan_decodes(plan)
        self._plan_extends(plan)
        if not plan:
            stuck = self.running or any(r.status is ReqStatus.WAITING for r in self.waiting)
            if stuck and len(self.pins):
                # nothing can run for want of memory: pinned prefixes (a cache hint) yield, oldest
                # first, to requests that could otherwise never run; the next step retries
                log.info("memory is short for the next request: releasing the oldest pinned prefix")
                self.pins.drop_oldest()
                self.sessions.expire()
            elif self.running:
                # every running request is stuck on memory: free the newest so the rest progress
                self.preempt(self._newest_running())
        return plan

    def _plan_decodes(self, plan: StepPlan) -> None:
        """One item per decoding request: its last token, plus its jump-forward draft if it has one
        (those items go after the plain decodes, which the forward batch wants first). A decode
        with no room for its next token preempts the newest request, itself included."""
        ready: list[Req] = []
        for req in sorted((r for r in self.running if r.is_decoding), key=lambda r: r.arrival_time):
            while req.status is RUNNING and not self.memory.grow(req, req.seq_len):
                self.preempt(self._newest_running())
            ready.append(req)
        ready = self.fair.pick_decodes(ready)  # past its client's share, a decode pauses
        cut_drafts(ready, self.fair.costs.draft_cost)  # the drafts its measured cost pays for
        drafted: list[tuple[Req, PlanItem]] = []
        failed = False
        draft_budget = policy.MAX_DRAFT_TOKENS_PER_STEP
        for req in ready:
            if req.status is not RUNNING:  # preempted (or its beam search) for room
                continue
            try:
                item, num_draft = self.items.decode(req, draft_budget, plan.mask_sources)
            except Exception as e:  # the grammar's draft states, say: this request's failure alone
                log.exception("planning %s failed", req.rid)
                self.fail(req, f"internal error: {type(e).__name__}: {e}", 500)
                failed = True
                continue
            draft_budget -= num_draft
            if num_draft:
                drafted.append((req, item))
                self.stats.num_draft_tokens += num_draft
            else:
                plan.reqs.append(req)
                plan.items.append(item)
        for req, item in drafted:
            plan.add(req, item)
        if failed:
            # a beam that failed to plan ends its search: its siblings' items leave the step (their
            # pages and rows are free again)
            kept = [(r, it) for r, it in zip(plan.reqs, plan.items) if r.status is RUNNING]
            plan.reqs, plan.items = [r for r, _ in kept], [it for _, it in kept]

    def _plan_extends(self, plan: StepPlan) -> None:
        budget = self.config.chunked_prefill_size
        inflight: list[list[int]] = []
        for req in self.running:
            if req.is_decoding or budget <= 0:
                continue
            computed = req.kv.computed_len
            target = min(req.seq_len, computed + self.fair.budget(req, budget))
            if target > computed and self.memory.grow(req, target):
                plan.add(req, self.items.extend(req, target, plan.mask_sources))
                budget -= target - computed
                self.fair.spend(req, target - computed)
                inflight.append(req.tree_ids(req.fill_ids))
        if budget > 0 and self.waiting:

            def extend_item(req: Req, target: int, start: int, copies: tuple) -> PlanItem:
                return self.items.extend(req, target, plan.mask_sources, start, copies)

            for req, item in self.role.admit(
                self.waiting, self.running, budget, inflight, self.admission, extend_item
            ):
                plan.add(req, item)

    # ---------------------------------------------------------------- results
    def _apply(self, plan: StepPlan, results: list[ItemResult]) -> None:
        for req, item, res in zip(plan.reqs, plan.items, results):
            if req.status is FINISHED:  # a beam whose group ended earlier in this loop
                continue
            try:
                self.faults.check("apply", req.origin_input_ids)
                self._apply_item(req, item, res)
            except Exception as e:  # stop matching, grammar, finish rules: this request's alone
                log.exception("applying the step to %s failed", req.rid)
                if not req.finished:
                    self.fail(req, f"internal error: {type(e).__name__}: {e}", 500)
        self.beams.advance(self.running, self.waiting)

    def _apply_item(self, req: Req, item: PlanItem, res: ItemResult) -> None:
        if item.num_draft:
            reason = take_draft(req, item, res, self.eos_ids, self.memory, self.stats)
            self._after_tokens(req, reason)
            return
        computed = item.computed_len + len(item.new_ids)
        self.memory.computed(req, computed)
        self.stats.on_computed(len(req.origin_input_ids), item.computed_len, computed)
        req.kv.pending_copies = []  # made by this step's forward
        if item.logits_start is not None:
            apply_prompt_logprobs(req, item.computed_len, res)
        if res.next_id is None or not req.output_ids:
            self.memory.share(req)  # a finished chunk, or the whole prompt
        if res.next_id is None:
            return
        if req.beam is not None:  # the group advances once all its beams offered
            req.beam.offer(req, res.beam_offers or [])
            return
        if req.sampling.max_new_tokens == 0:  # prefill only (cache warm-up, prompt scoring)
            self.finish(req, FinishReason.length_limit(0))
            return
        reason = apply_sampled_token(req, res, self.eos_ids)
        if self.role.on_sampled(req, reason, res):  # a prefill server hands it to the transfer
            self.running.remove(req)
            req.move_to(ReqStatus.SENDING)
            return
        self._after_tokens(req, reason)

    def _after_tokens(self, req: Req, reason: FinishReason | None) -> None:
        if reason is not None:
            self.finish(req, reason)
            return
        req.draft_ids, req.draft_states = next_draft(req, self.config, self.tree)
        if req.options.stream:
            self.outbox.emit(req)

    def _transfer_done(self, done: TransferDone) -> None:
        """A request the KV role held runs again: to finish, to fail, or to decode from `first`."""
        req = done.req
        req.move_to(ReqStatus.RUNNING)
        self.running.append(req)  # so finish releases it as any running request
        if done.error is not None:
            self.fail(req, done.error, 500)
        elif done.reason is not None:
            self.finish(req, done.reason)
        else:
            self.memory.computed(req, len(req.origin_input_ids))
            self.memory.share(req)  # the received prompt pages join this server's tree
            self._after_tokens(req, apply_sampled_token(req, done.first, self.eos_ids))

    # ---------------------------------------------------------------- endings
    def finish(self, req: Req, reason: FinishReason) -> None:
        """req ends (a beam's end ends its whole search): its memory goes back (its KV into the
        tree, pinned when asked), its last delta out."""
        if req.beam is not None:
            self.beams.end(
                req.beam, self.running, self.waiting, reason, req.error, req.error_status
            )
            return
        req.draft_ids, req.draft_states = [], []
        self.role.on_finish(req, reason)
        pinned = req.options.pin_ttl_s is not None or req.session_key is not None
        holds = req.kv.table_row is not None
        pin_ids = req.tree_ids(req.fill_ids[: req.kv.computed_len]) if pinned and holds else None
        if holds:
            self._release(req)
        if pin_ids is not None and not reason.is_abort:
            if req.options.pin_ttl_s is not None:
                reason = reason.with_pin(self.pins.pin(pin_ids, req.options.pin_ttl_s))
            if req.session_key is not None:
                self.sessions.on_finish(req.session_key, pin_ids)
        req.end(reason)
        self.stats.on_finish(req)
        self.outbox.emit(req)

    def fail(self, req: Req, error: str, status: int, reason: str | None = None) -> None:
        """End req with an error for its client (400: refused; 500: failed inside the server)."""
        req.error, req.error_status = error, status
        self.finish(req, FinishReason.abort(reason or error))

    def preempt(self, req: Req) -> None:
        """Give req's memory back (its KV goes into the tree, so resuming is mostly a cache hit);
        it waits at the head of the queue. A beam takes its whole search with it."""
        if req.beam is not None:
            self.beams.restart(req.beam, self.running, self.waiting)
            return
        log.debug("preempting %s", req)
        self._release(req)
        req.move_to(ReqStatus.WAITING)
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.insert(0, req)

    def _cached(self, req: Req) -> int:
        """Tokens of a waiting req the pool holds (a read-only guess, for the fair share)."""
        return cached_len(self.tree, match_ids(req))

    def _newest_running(self) -> Req:
        return max(self.running, key=lambda r: (r.arrival_time, -len(r.output_ids)))

    def _release(self, req: Req) -> None:
        self.memory.release(req)
        self.running.remove(req)

    # ---------------------------------------------------------------- lifecycle
    def check_integrity(self) -> None:
        """The memory invariant (integrity.py); AssertionError naming what broke."""
        holding = self.running + self.role.held()
        check_integrity(self.memory, holding, self.waiting, len(self.pins))

    def close(self) -> None:
        """Stop the grammar compile workers, what the runner started and the KV transfer."""
        try:
            for backend in self.grammar_backends.built() if self.grammar_backends else []:
                backend.shutdown()
        finally:  # the runner's workers and tier file go even when a grammar backend fails
            try:
                self.runner.close()
            finally:
                self.role.close()
