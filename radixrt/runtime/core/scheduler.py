"""The event loop's body: admit, chunk prefill, decode, preempt, finish. No tensors here.

One `step()` plans one forward over a mixed batch (decode requests first, then decodes that
carry a jump-forward draft to verify, then extends: prefill chunks, resumed requests), hands
the plan (plain data, core/plan.py) to the model runner and applies the sampled tokens; the
deltas wait in take_outputs(). Intake, admission, plan items, drafts, memory moves, finish rules
and the admin calls (scheduler_admin.py) live in their own modules beside this one.
"""

from __future__ import annotations

import logging

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import schedule_policy as policy
from radixrt.runtime.core.admission import Admission
from radixrt.runtime.core.drafts import next_draft, take_draft
from radixrt.runtime.core.faults import FaultInjector
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.intake import GrammarBackends, check_queue, new_req, refusal
from radixrt.runtime.core.lora_slots import LoraSlots
from radixrt.runtime.core.namespaces import TreeNamespaces
from radixrt.runtime.core.outbox import Outbox
from radixrt.runtime.core.page_allocator import PageAllocator, TableRows
from radixrt.runtime.core.pd_link import KVLink
from radixrt.runtime.core.pins import PinTable
from radixrt.runtime.core.plan import ItemResult, PlanItem, Runner
from radixrt.runtime.core.plan_items import ItemBuilder
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_finish import (
    apply_prompt_logprobs,
    apply_sampled_token,
)
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_admin import SchedulerAdmin
from radixrt.runtime.core.scheduler_beams import SchedulerBeams
from radixrt.runtime.core.scheduler_pd import SchedulerPD, bootstrap_of
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.core.sessions import SessionTable
from radixrt.runtime.core.step_recovery import StepRecovery
from radixrt.runtime.core.tiered_cache import make_tree
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.edge import EdgeLimits, constraint_of

log = logging.getLogger(__name__)


class Scheduler(SchedulerAdmin, SchedulerBeams, StepRecovery, SchedulerPD):
    def __init__(
        self,
        config: ServerConfig,
        runner: Runner,
        grammar_backends: GrammarBackends | None = None,
        kv_link: KVLink | None = None,
    ):
        """runner: model/model_runner.ModelRunner (scheduler_factory builds both) or a test's fake.
        grammar_backends: constrained/choose.py's BackendChooser (None: constraints are refused).
        kv_link: the KV transfer of --disaggregation-mode prefill|decode (disaggregation/)."""
        self.config = config
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.page_size = config.page_size
        self.allocator = PageAllocator(runner.num_pages, self.page_size)
        self.tree = make_tree(config, self.allocator, runner)  # a TieredRadixCache with a tier
        self.memory = ReqMemory(self.allocator, self.tree, TableRows(runner.max_rows))
        self.context_len = runner.context_length
        self.pool_tokens = runner.num_pages * self.page_size
        self.limits = EdgeLimits(
            runner.vocab_size,
            self.context_len,
            self.pool_tokens,
            min(config.max_running_requests, runner.max_rows),
            self.page_size,
        )
        self.eos_ids = set(runner.eos_token_ids)
        self._eos_list = sorted(self.eos_ids)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.beam_groups = {}
        self.outbox = Outbox()
        self.pins = PinTable(self.tree, self.pool_tokens)
        self.sessions = SessionTable(self.pins, config.session_ttl)
        self.stats = SchedulerStats()
        self.faults = FaultInjector()
        self.lora_slots = LoraSlots(config.max_loras_per_batch)
        self.namespaces = TreeNamespaces()  # the tree's (adapter, cache_salt) namespaces
        self._init_pd(config.disaggregation_mode, kv_link)
        self.admission = Admission(
            config,
            self.tree,
            self.memory,
            self.stats,
            self.sessions,
            fork_samples=self.pd_mode != "decode",  # a decode server computes no prompt to fork
            lora_slots=self.lora_slots,
        )
        self.grammar_backends = grammar_backends
        # (faults looked up at each call: a test swaps the injector)
        self.items = ItemBuilder(self.memory, self._eos_list, lambda *a: self.faults.check(*a))
        self.model_info = {
            "model_path": runner.model_path,
            "context_length": self.context_len,
            "vocab_size": runner.vocab_size,
            "eos_token_ids": self._eos_list,
            "is_generation": True,
            "dtype": runner.dtype_name,
        }

    # ---------------------------------------------------------------- intake
    def add_request(self, msg: TokenizedGenerateReq) -> list[TokenOut]:
        """Queue a request; anything wrong with it (or any failure taking it in) ends it alone."""
        try:
            req = new_req(msg, self.limits, self.tokenizer, self.faults.check)
            req.bootstrap = bootstrap_of(msg)
            self._check_room(req)
            check_queue(len(self.waiting) + len(self.running), self.config)
            if req.lora is not None:
                self.check_lora(req.lora)
            req.key_offset = self.namespaces.key_offset(req.lora, msg.cache_salt)
            constraint = constraint_of(req.sampling)
            if constraint is not None:
                req.grammar_future = self.get_grammar_backend(constraint[0]).request(*constraint)
            if req.sampling.is_beam:
                self._start_beam_group(req)
            self.waiting.append(req)
            return self.outbox.drain()
        except Exception as e:  # ValueError: refused; anything else: our bug, still only this one's
            if not isinstance(e, (ValueError, TypeError)):
                log.exception("intake of %s failed", msg.rid)
            self.waiting = [r for r in self.waiting if r.rid != msg.rid]
            self.beam_groups.pop(msg.rid, None)
            self._refused_room(bootstrap_of(msg), e)
            return [refusal(msg, e)]

    def abort(self, rid: str) -> list[TokenOut]:
        self._abort_held(rid)
        if rid in self.beam_groups:
            self._end_beam_group(self.beam_groups[rid], FinishReason.abort("aborted by the client"))
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish(req, FinishReason.abort("aborted by the client"))
        for req in list(self.running):
            if req.rid == rid:
                self._finish(req, FinishReason.abort("aborted by the client"))
        return self.outbox.drain()

    # ---------------------------------------------------------------- the step
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> bool:
        """Plan one step and run its forward; True when a forward ran. The step's outputs wait in
        take_outputs()."""
        if self.pins.expire():  # sessions whose pin lapsed end with it
            self.sessions.expire()
        self.admission.collect_grammars(self.waiting, self.faults.check, self._fail)
        mask_sources = self.items.start_step()
        plan = self._plan()
        if not plan:
            return False
        self.stats.num_forwards += 1
        try:
            results = self.runner.run([item for _, item in plan], mask_sources)
            if self.faults.enabled:  # off in production: no per-step work
                self.faults.check_plan([req.origin_input_ids for req, _ in plan])
        except Exception as e:
            self._recover(plan, e)
            return True
        finally:
            mask_sources.clear()  # live grammar states: not kept past the step
        self._apply(plan, results)
        return True

    def take_outputs(self) -> list[TokenOut]:
        """The deltas and finishes produced since the last call."""
        return self.outbox.drain()

    def _plan(self) -> list[tuple[Req, PlanItem]]:
        decodes = self._plan_decodes()
        extends = self._plan_extends()
        if not decodes and not extends:
            stuck = self.running or any(r.grammar_future is None for r in self.waiting)
            if stuck and len(self.pins):
                # nothing can run for want of memory: pinned prefixes (a cache hint) yield, oldest
                # first, to requests that could otherwise never run; the next step retries
                log.info("memory is short for the next request: releasing the oldest pinned prefix")
                self.pins.drop_oldest()
                self.sessions.expire()
            elif self.running:
                # every running request is stuck on memory: free the newest so the rest progress
                self._preempt(self._newest_running())
        return decodes + extends

    def _plan_decodes(self) -> list[tuple[Req, PlanItem]]:
        """One item per decoding request: its last token, plus its jump-forward draft if it has one
        (those items go after the plain decodes, which the forward batch wants first)."""
        ready: list[Req] = []
        for req in sorted((r for r in self.running if r.is_decoding), key=lambda r: r.arrival_time):
            if req.table_row is None:
                continue  # preempted as a victim earlier in this loop
            while not self.memory.grow(req, req.seq_len):
                self._preempt(self._newest_running())
                if req.table_row is None:  # req itself, or a beam of the preempted group
                    break
            else:
                ready.append(req)
        plain, drafted = [], []
        draft_budget = policy.MAX_DRAFT_TOKENS_PER_STEP
        for req in ready:
            if req.table_row is None:
                continue
            try:
                item, num_draft = self.items.decode(req, draft_budget)
            except Exception as e:  # the grammar's draft states, say: this request's failure alone
                log.exception("planning %s failed", req.rid)
                self._fail(req, f"internal error: {type(e).__name__}: {e}", 500)
                continue
            draft_budget -= num_draft
            (drafted if num_draft else plain).append((req, item))
            self.stats.num_draft_tokens += num_draft
        return plain + drafted

    def _plan_extends(self) -> list[tuple[Req, PlanItem]]:
        budget = self.config.chunked_prefill_size
        items: list[tuple[Req, PlanItem]] = []
        inflight: list[list[int]] = []
        for req in self.running:
            if req.is_decoding or budget <= 0:
                continue
            target = min(req.seq_len, req.kv_len + budget)
            if self.memory.grow(req, target):
                items.append((req, self.items.extend(req, target)))
                budget -= target - req.kv_len
                inflight.append(req.tree_ids(req.fill_ids))
        if budget > 0 and self.waiting:
            items += self._admit_waiting(budget, inflight)
        return items

    # ---------------------------------------------------------------- results
    def _apply(self, plan: list[tuple[Req, PlanItem]], results: list[ItemResult]) -> None:
        for (req, item), res in zip(plan, results):
            if req.finished:  # a beam whose group ended earlier in this loop
                continue
            try:
                self.faults.check("apply", req.origin_input_ids)
                self._apply_item(req, item, res)
            except Exception as e:  # stop matching, grammar, finish rules: this request's alone
                log.exception("applying the step to %s failed", req.rid)
                if not req.finished:
                    self._fail(req, f"internal error: {type(e).__name__}: {e}", 500)
        self._advance_beams()

    def _apply_item(self, req: Req, item: PlanItem, res: ItemResult) -> None:
        if item.num_draft:
            reason = take_draft(req, item, res, self.eos_ids, self.memory, self.stats)
            self._after_tokens(req, reason)
            return
        self.memory.computed(req, item.prefix_len + len(item.new_ids))
        self.stats.on_computed(len(req.origin_input_ids), item.prefix_len, req.kv_len)
        req.pending_copies = []  # made by this step's forward
        if item.logits_start is not None:
            apply_prompt_logprobs(req, item.prefix_len, res)
        if res.next_id is None or not req.output_ids:
            self.memory.share(req)  # a finished chunk, or the whole prompt
        if res.next_id is None:
            return
        if req.beam is not None:  # the group advances once all its beams offered
            req.beam.offer(req, res.beam_offers or [])
            return
        if req.sampling.max_new_tokens == 0:  # prefill only (cache warm-up, prompt scoring)
            self._finish(req, FinishReason.length_limit(0))
            return
        reason = apply_sampled_token(req, res, self.eos_ids)
        if req.bootstrap is not None and self.pd_mode == "prefill":
            self._hand_off(req, reason, res)  # the decode server goes on from here
            return
        self._after_tokens(req, reason)

    def _after_tokens(self, req: Req, reason: FinishReason | None) -> None:
        if reason is not None:
            self._finish(req, reason)
            return
        req.draft_ids, req.draft_states = next_draft(req, self.config)
        if req.stream:
            self.outbox.emit(req)

    def _finish(self, req: Req, reason: FinishReason) -> None:
        if req.beam is not None:  # a beam's abort or failure ends its whole search
            self._end_beam_group(req.beam, reason, req.error, req.error_status)
            return
        req.draft_ids, req.draft_states = [], []
        self._pd_ended(req, reason)
        pinned = req.pin_ttl_s is not None or req.session_id is not None
        keep = pinned and req.table_row is not None
        pin_ids = req.tree_ids(req.fill_ids[: req.kv_len]) if keep else None
        if req.table_row is not None:
            self._release(req)
        if pin_ids is not None and not reason.is_abort:
            if req.pin_ttl_s is not None:
                reason = reason.with_pin(self.pins.pin(pin_ids, req.pin_ttl_s))
            if req.session_id is not None:
                self.sessions.on_finish(req.session_id, pin_ids)
        req.finished_reason = reason
        self.stats.on_finish(req)
        self.outbox.emit(req)

    def _fail(self, req: Req, error: str, status: int, reason: str | None = None) -> None:
        """End req with an error for its client (400: refused; 500: failed inside the server)."""
        req.error, req.error_status = error, status
        self._finish(req, FinishReason.abort(reason or error))

    def _release(self, req: Req) -> None:
        self.memory.release(req)
        self.running.remove(req)
