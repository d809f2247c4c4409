"""A running request's part of the next step as a PlanItem, and the step's mask sources.

A decode feeds the request's last token (plus its jump-forward draft, when it has one); an extend
feeds the next chunk of its prompt. Building an item also claims the request's table row for the
step (the row is rewritten from write_start) and collects each constrained pick's mask source: the
plan carries only its index (core/plan.py)."""

from __future__ import annotations

from typing import Any, Callable

from radixrt.runtime.core.admission import wants_prompt_logprobs
from radixrt.runtime.core.drafts import fit_draft
from radixrt.runtime.core.page_allocator import slots_of
from radixrt.runtime.core.plan import PlanItem, SampleRow
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_finish import sample_rows
from radixrt.runtime.core.req_memory import ReqMemory


class ItemBuilder:
    def __init__(self, memory: ReqMemory, eos_ids: list[int], check_fault: Callable):
        self.memory = memory
        self.page_size = memory.page_size
        self.eos_ids = eos_ids
        self.check_fault = check_fault
        self.mask_sources: list[Any] = []  # the step's, indexed by SampleRow.mask

    def start_step(self) -> list[Any]:
        """A new step: a fresh list of mask sources (the runner gets it with the plan)."""
        self.mask_sources = []
        return self.mask_sources

    def decode(self, req: Req, draft_budget: int) -> tuple[PlanItem, int]:
        """req's last token and as much of its draft as draft_budget and its pages allow."""
        self.check_fault("plan", req.origin_input_ids)
        num_draft = fit_draft(req, self.memory, draft_budget)
        pos = req.kv_len
        start = self._claim_row(req)
        item = PlanItem(
            row=req.table_row,
            new_ids=[req.output_ids[-1]] + req.draft_ids,
            prefix_len=pos,
            slots=slots_of(req.page_ids, start, pos + 1 + num_draft, self.page_size),
            write_start=start,
            picks=self._picks(req, req.draft_ids, req.draft_states),
            num_draft=num_draft,
            prompt_ids=req.origin_input_ids,
            output_ids=req.output_ids,
            page_copies=tuple(req.pending_copies),
            lora_name=req.lora,
            lora_slot=req.lora_slot,
        )
        return item, num_draft

    def extend(
        self, req: Req, target: int, write_start: int | None = None, page_copies: tuple = ()
    ) -> PlanItem:
        """req's tokens from kv_len up to target; a pick when the chunk completes the prompt. The
        table row is written from write_start (admission: 0, a new row), by default from kv_len or,
        when the row is stale, whole."""
        if write_start is None:
            write_start = self._claim_row(req)
        logits_start = None
        if wants_prompt_logprobs(req):
            logits_start = max(req.logprob_start_len - 1, 0)
        return PlanItem(
            row=req.table_row,
            new_ids=req.fill_ids[req.kv_len : target],
            prefix_len=req.kv_len,
            slots=slots_of(req.page_ids, write_start, target, self.page_size),
            write_start=write_start,
            logits_start=logits_start,
            picks=self._picks(req, [], []) if target == req.seq_len else (),
            prompt_ids=req.origin_input_ids,
            output_ids=req.output_ids,
            top_logprobs_num=req.top_logprobs_num,
            page_copies=tuple(page_copies),
            lora_name=req.lora,
            lora_slot=req.lora_slot,
        )

    def _claim_row(self, req: Req) -> int:
        start = self.memory.table_write_start(req)
        self.memory.row_planned(req)
        return start

    def _picks(self, req: Req, draft_ids: list[int], draft_states: list) -> tuple[SampleRow, ...]:
        return sample_rows(req, draft_ids, draft_states, self.eos_ids, self.mask_sources)
