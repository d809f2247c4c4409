"""The event loop's body: admit, chunk prefill, decode, preempt, finish. No tensors here.

One `step()` plans one forward over a mixed batch (decode requests first, then decodes that
carry a jump-forward draft to verify, then extends: prefill chunks, resumed requests), hands
the plan to the model runner and applies the sampled tokens. Deltas come back as TokenOut messages.
"""
from __future__ import annotations

import logging

from radixrt.runtime import schedule_policy as policy
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.page_pool import PageAllocator, slots_of
from radixrt.runtime.plan import ItemResult, PlanItem
from radixrt.runtime.radix_cache import RadixCache
from radixrt.runtime.req import Req
from radixrt.runtime.pins import PinTable
from radixrt.runtime.req_finish import abort_reason, apply_prompt_logprobs, apply_sampled_token
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler_stats import SchedulerStats

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: ServerConfig, runner=None):
        if runner is None:
            from radixrt.runtime.model_runner import ModelRunner  # torch only where a model runs
            runner = ModelRunner(config)
        self.config = config
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.page_size = config.page_size
        self.allocator = PageAllocator(runner.num_pages, self.page_size)
        self.tree = RadixCache(self.allocator, self.page_size, disable=config.disable_radix_cache)
        self.context_len = runner.context_length
        self.pool_tokens = runner.num_pages * self.page_size
        self.eos_ids = set(runner.eos_token_ids)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._free_rows = list(range(runner.max_rows - 1, -1, -1))
        self._outbox: list[TokenOut] = []
        self.pins = PinTable(self.tree, self.pool_tokens)
        self.stats = SchedulerStats()
        self.grammar_backend = None
        self.model_info = {
            "model_path": runner.model_path, "context_length": self.context_len,
            "vocab_size": runner.vocab_size, "eos_token_ids": sorted(self.eos_ids),
            "is_generation": True,
        }

    # ---------------------------------------------------------------- intake
    def add_request(self, msg: TokenizedGenerateReq) -> list[TokenOut]:
        try:
            sampling = SamplingParams.from_dict(msg.sampling_params)
            self._check_fits(msg, sampling)
        except ValueError as e:
            return [TokenOut(rid=msg.rid, new_ids=[], finished_reason=abort_reason(str(e)), error=str(e),
                             prompt_tokens=len(msg.input_ids))]
        # the output may not run past the context
        sampling.max_new_tokens = min(sampling.max_new_tokens, self.context_len - len(msg.input_ids))
        req = Req(msg.rid, msg.input_ids, sampling, return_logprob=msg.return_logprob,
                  logprob_start_len=msg.logprob_start_len if msg.return_logprob else -1,
                  top_logprobs_num=msg.top_logprobs_num, stream=msg.stream, program_id=msg.program_id,
                  arrival_time=msg.arrival_time or None)
        req.pin_ttl_s = msg.pin_ttl_s
        constraint = self._constraint(sampling)
        if constraint is not None:
            req.grammar_future = self._grammar().request(*constraint)
        self.waiting.append(req)
        return self._drain_outbox()

    def _check_fits(self, msg: TokenizedGenerateReq, sampling: SamplingParams) -> None:
        n = len(msg.input_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if any(not isinstance(t, int) or t < 0 or t >= self.runner.vocab_size for t in msg.input_ids):
            raise ValueError(f"input_ids must be ints in [0, {self.runner.vocab_size})")
        if n >= self.context_len:
            raise ValueError(f"the prompt has {n} tokens; the context length is {self.context_len}")
        need = n + min(sampling.max_new_tokens, self.context_len - n)
        if need > self.pool_tokens:
            raise ValueError(f"the request needs {need} tokens of KV (prompt {n} + max_new_tokens) but the "
                             f"whole KV pool holds {self.pool_tokens}; it can never run")
        if msg.return_logprob and not (-1 <= msg.logprob_start_len < n):
            raise ValueError(f"logprob_start_len must be in [-1, {n - 1}], got {msg.logprob_start_len}")
        if not (0 <= msg.top_logprobs_num <= 20):
            raise ValueError(f"top_logprobs_num must be in [0, 20], got {msg.top_logprobs_num}")

    @staticmethod
    def _constraint(sampling: SamplingParams) -> tuple[str, object] | None:
        for kind in ("regex", "json_schema", "choices"):
            spec = getattr(sampling, kind)
            if spec is not None:
                return kind, spec
        return None

    def _grammar(self):
        if self.grammar_backend is None:
            from radixrt.runtime.grammar import GrammarBackend
            self.grammar_backend = GrammarBackend(
                self.tokenizer, self.runner.vocab_size, sorted(self.eos_ids),
                cache_size=self.config.grammar_cache_size, compile_timeout=self.config.grammar_compile_timeout,
                enable_jump_forward=self.config.enable_jump_forward)
        return self.grammar_backend

    def abort(self, rid: str) -> list[TokenOut]:
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish(req, abort_reason("aborted by the client"))
        for req in list(self.running):
            if req.rid == rid:
                self._finish(req, abort_reason("aborted by the client"))
        return self._drain_outbox()

    # ---------------------------------------------------------------- the step
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[TokenOut]:
        self.pins.expire()
        self._collect_grammars()
        plan = self._plan()
        if plan:
            self.stats.num_forwards += 1
            results = self.runner.run(plan)
            self._apply(plan, results)
        return self._drain_outbox()

    def _plan(self) -> list[PlanItem]:
        decodes = self._plan_decodes()
        extends = self._plan_extends()
        if not decodes and not extends and self.running:
            # every running request is stuck on memory: free the newest so the rest progress
            self._preempt(self._newest_running())
        return decodes + extends

    def _plan_decodes(self) -> list[PlanItem]:
        """One item per decoding request: its last token, plus its jump-forward draft if it has one
        (those items go after the plain decodes, which the forward batch wants first)."""
        ready: list[Req] = []
        for req in sorted((r for r in self.running if r.is_decoding), key=lambda r: r.arrival_time):
            if req.table_row is None:
                continue  # preempted as a victim earlier in this loop
            while not self._grow(req, req.seq_len):
                victim = self._newest_running()
                self._preempt(victim)
                if victim is req:
                    break
            else:
                ready.append(req)
        plain, drafted = [], []
        draft_budget = policy.MAX_DRAFT_TOKENS_PER_STEP
        for req in ready:
            if req.table_row is None:
                continue
            # a draft takes only free memory left once every request has room for its next token:
            # verifying drafts never preempts a request nor evicts the cache; without room, or past
            # the step's draft budget, the request decodes one token
            if req.draft_ids:
                num = min(len(req.draft_ids), draft_budget)
                req.draft_ids, req.draft_states = req.draft_ids[:num], req.draft_states[:num]
                if not num or not self._grow(req, req.seq_len + num, evict=False):
                    req.draft_ids, req.draft_states = [], []
                draft_budget -= len(req.draft_ids)
            pos = req.kv_len
            start = self._write_start(req)
            num_draft = len(req.draft_ids)
            item = PlanItem(req, [req.output_ids[-1]] + req.draft_ids, pos,
                            slots_of(req.page_ids, start, pos + 1 + num_draft, self.page_size), start, None, True,
                            num_draft)
            (drafted if num_draft else plain).append(item)
            self.stats.num_draft_tokens += num_draft
        return plain + drafted

    def _plan_extends(self) -> list[PlanItem]:
        budget = self.config.chunked_prefill_size
        items: list[PlanItem] = []
        inflight: list[list[int]] = []
        for req in self.running:
            if req.is_decoding or budget <= 0:
                continue
            target = min(req.seq_len, req.kv_len + budget)
            if self._grow(req, target):
                items.append(self._extend_item(req, target, write_start=self._write_start(req)))
                budget -= target - req.kv_len
                inflight.append(req.fill_ids)
        if budget > 0 and self.waiting:
            items += self._admit(budget, inflight)
        return items

    def _admit(self, budget: int, inflight: list[list[int]]) -> list[PlanItem]:
        ready = [r for r in self.waiting if getattr(r, "grammar_future", None) is None]
        if not ready:
            return []
        match_len: dict[int, int] = {}
        if self.config.schedule_policy == "lpm" and len(ready) <= policy.LPM_MAX_QUEUE:
            for r in ready:
                match_len[id(r)] = len(self.tree.match_prefix(self._match_ids(r))[0]) * self.page_size
        reserve = policy.decode_reserve_tokens(self.running)
        items: list[PlanItem] = []
        for req in policy.order_waiting(ready, match_len, self.config.schedule_policy):
            if budget <= 0 or not self._free_rows or len(self.running) >= self.config.max_running_requests:
                break
            ids = req.fill_ids
            pages, node = self.tree.match_prefix(self._match_ids(req))
            cached = len(pages) * self.page_size
            if policy.shares_inflight_prefix(ids, cached, inflight):
                continue
            target = min(len(ids), cached + budget)
            self.tree.inc_lock_ref(node)
            need = self.allocator.pages_for(target) - len(pages)
            reserve_pages = self.allocator.pages_for(reserve)
            if need + reserve_pages > self.allocator.num_free + self.tree.evictable_pages:
                self.tree.dec_lock_ref(node)
                break  # keep arrival fairness: nobody overtakes the request that does not fit
            req.page_ids, req.cached_len, req.kv_len, req.last_node = list(pages), cached, cached, node
            req.table_row = self._free_rows.pop()
            if self._wants_prompt_logprobs(req):
                req.input_logprobs = req.input_top_logprobs = None  # a resumed prefill scores them anew
            if not self._grow(req, target):  # cannot fail: counted above
                raise AssertionError("admission accounting is wrong")
            if not req.admitted:
                req.admitted = True
                req.prefix_hit_len = cached
                self.stats.on_admit(len(req.origin_input_ids), cached)
            self.waiting.remove(req)
            self.running.append(req)
            items.append(self._extend_item(req, target, write_start=0))
            inflight.append(ids)
            budget -= target - cached
            reserve += int(req.sampling.max_new_tokens * policy.NEW_TOKEN_RESERVE_RATIO)
        return items

    def _match_ids(self, req: Req) -> list[int]:
        """Tokens the tree may supply: never the last one (its logits are needed), and not the
        prompt positions whose logprobs were asked for (their logits must be computed)."""
        ids = req.fill_ids[:-1]
        if self._wants_prompt_logprobs(req):
            ids = ids[:max(req.logprob_start_len - 1, 0)]
        return ids

    @staticmethod
    def _wants_prompt_logprobs(req: Req) -> bool:
        return req.logprob_start_len >= 0 and not req.output_ids

    def _extend_item(self, req: Req, target: int, write_start: int) -> PlanItem:
        logits_start = None
        if self._wants_prompt_logprobs(req):
            logits_start = max(req.logprob_start_len - 1, 0)
        return PlanItem(req, req.fill_ids[req.kv_len:target], req.kv_len,
                        slots_of(req.page_ids, write_start, target, self.page_size), write_start,
                        logits_start, target == req.seq_len)

    @staticmethod
    def _write_start(req: Req) -> int:
        """First position whose slot goes into the req's table row this step."""
        if req.table_stale:
            req.table_stale = False
            return 0
        return req.kv_len

    def _share(self, req: Req) -> None:
        """Put req's computed whole pages into the tree so waiting requests can match them."""
        before = req.page_ids[:]
        self.tree.cache_unfinished_req(req, req.fill_ids[:req.kv_len])
        if req.page_ids != before:  # our duplicates were swapped for the tree's pages
            req.table_stale = True

    def _grow(self, req: Req, num_tokens: int, evict: bool = True) -> bool:
        """Make req's pages cover num_tokens positions, evicting from the tree if needed (and allowed)."""
        need = self.allocator.pages_for(num_tokens) - len(req.page_ids)
        if need <= 0:
            return True
        if self.allocator.num_free < need and evict:
            self.tree.evict(need - self.allocator.num_free)
        pages = self.allocator.alloc(need)
        if pages is None:
            return False
        req.page_ids.extend(pages)
        return True

    # ---------------------------------------------------------------- results
    def _apply(self, plan: list[PlanItem], results: list[ItemResult]) -> None:
        for item, res in zip(plan, results):
            req = item.req
            if item.num_draft:
                self._apply_draft(item, res)
                continue
            req.kv_len = item.prefix_len + len(item.new_ids)
            if item.logits_start is not None:
                apply_prompt_logprobs(req, item.prefix_len, res)
            if res.next_id is None or not req.output_ids:
                self._share(req)  # a finished chunk, or the whole prompt
            if res.next_id is None:
                continue
            if req.sampling.max_new_tokens == 0:  # prefill only (cache warm-up, prompt scoring)
                self._finish(req, {"type": "length", "length": 0})
                continue
            self._after_tokens(req, apply_sampled_token(req, res, self.eos_ids, self.tokenizer))

    def _apply_draft(self, item: PlanItem, res: ItemResult) -> None:
        """Take the draft up to the first position whose pick differs from it, and that pick."""
        req = item.req
        draft = item.new_ids[len(item.new_ids) - item.num_draft:]
        picks = [res] + (res.draft_results or [])
        # one pick per position, but none after a draft that ends the grammar
        assert len(draft) <= len(picks) <= len(draft) + 1, (len(picks), len(draft))
        reason = None
        for j, pick in enumerate(picks):
            req.kv_len = req.seq_len  # the last token and the draft tokens taken so far were fed
            agrees = j < len(draft) and pick.next_id == draft[j]
            self.stats.num_draft_accepted += agrees
            reason = apply_sampled_token(req, pick, self.eos_ids, self.tokenizer)
            if reason is not None or not agrees:
                break
        assert reason is not None or not agrees or len(picks) == len(draft) + 1, "a draft ended the grammar, not the request"
        if reason is None:
            self._trim_pages(req)
        self._after_tokens(req, reason)

    def _trim_pages(self, req: Req) -> None:
        """Give back pages grown for draft tokens that were not taken (they hold no KV worth keeping)."""
        keep = self.allocator.pages_for(req.seq_len)
        if len(req.page_ids) > keep:
            self.allocator.free(req.page_ids[keep:])
            del req.page_ids[keep:]

    def _after_tokens(self, req: Req, reason: dict | None) -> None:
        if reason is not None:
            self._finish(req, reason)
            return
        if req.grammar is not None:  # the next draft; output_ids + draft + one pick stay within max_new_tokens
            req.draft_ids, req.draft_states = req.grammar.draft(req.sampling.max_new_tokens - len(req.output_ids) - 1)
        if req.stream:
            self._emit(req)

    def _finish(self, req: Req, reason: dict) -> None:
        req.draft_ids, req.draft_states = [], []
        pin_ids = req.fill_ids[:req.kv_len] if req.pin_ttl_s is not None and req.table_row is not None else None
        if req.table_row is not None:
            self._release(req)
        if pin_ids is not None and reason["type"] != "abort":
            reason = {**reason, "pinned": self.pins.pin(req.rid, pin_ids, req.pin_ttl_s)}
        req.finished_reason = reason
        self.stats.on_finish(req)
        self._emit(req)

    def _release(self, req: Req) -> None:
        self.tree.cache_finished_req(req, req.fill_ids[:req.kv_len])
        self._free_rows.append(req.table_row)
        req.table_row = None
        self.running.remove(req)

    def _newest_running(self) -> Req:
        return max(self.running, key=lambda r: (r.arrival_time, -len(r.output_ids)))

    def _preempt(self, req: Req) -> None:
        """Give req's memory back (its KV goes into the tree, so resuming is mostly a cache hit)."""
        log.debug("preempting %s", req)
        self._release(req)
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.insert(0, req)

    def _collect_grammars(self) -> None:
        for req in list(self.waiting):
            fut = getattr(req, "grammar_future", None)
            if fut is None or not fut.done():
                continue
            req.grammar_future = None
            try:
                req.grammar = fut.result()
            except ValueError as e:
                self.waiting.remove(req)
                req.grammar_error = str(e)
                self._finish(req, abort_reason(f"invalid constraint: {e}"))

    def _emit(self, req: Req) -> None:
        new_ids = req.output_ids[req.num_sent:]
        first = req.num_sent
        req.num_sent = len(req.output_ids)
        out = TokenOut(rid=req.rid, new_ids=new_ids, finished_reason=req.finished_reason,
                       prompt_tokens=len(req.origin_input_ids), completion_tokens=len(req.output_ids),
                       cached_tokens=req.prefix_hit_len, error=req.grammar_error)
        if req.return_logprob:
            out.output_logprobs = req.output_logprobs[first:]
            out.output_top_logprobs = req.output_top_logprobs[first:]
            if not req.input_logprobs_sent and req.input_logprobs is not None:
                out.input_logprobs, out.input_top_logprobs = req.input_logprobs, req.input_top_logprobs
                req.input_logprobs_sent = True
        self._outbox.append(out)

    def _drain_outbox(self) -> list[TokenOut]:
        out, self._outbox = self._outbox, []
        return out

    # ---------------------------------------------------------------- admin
    def unpin(self, handle: str) -> bool:
        return self.pins.unpin(handle)

    def flush_cache(self) -> bool:
        if self.running:
            return False
        return self.tree.reset()

    def server_info(self) -> dict:
        return self.stats.server_info(self)

    def check_integrity(self) -> None:
        self.stats.check_integrity(self)
