"""A running request's part of the next step as a PlanItem, and the step's mask sources.

A decode feeds the request's last token (plus its jump-forward draft, when it has one); an extend
feeds the next chunk of its prompt. Building an item also claims the request's table row for the
step (the row is rewritten from write_start) and puts each constrained pick's mask source on the
step's list (StepPlan.mask_sources): the item carries only its index (core/plan.py)."""

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

    def decode(self, req: Req, draft_budget: int, masks: list[Any]) -> tuple[PlanItem, int]:
        """req's last token and as much of its draft as draft_budget and its pages allow; its
        constrained picks' mask sources go on masks (the step's: StepPlan.mask_sources)."""
        self.check_fault("plan", req.origin_input_ids)
        num_draft = fit_draft(req, self.memory, draft_budget)
        kv = req.kv
        pos = kv.computed_len
        start = self._claim_row(req)
        item = PlanItem(
            row=kv.table_row,
            new_ids=[req.output_ids[-1]] + req.draft_ids,
            computed_len=pos,
            slots=slots_of(kv.page_ids, start, pos + 1 + num_draft, self.page_size),
            write_start=start,
            picks=self._picks(req, req.draft_ids, req.draft_states, masks),
            num_draft=num_draft,
            prompt_ids=req.origin_input_ids,
            output_ids=req.output_ids,
            page_copies=tuple(kv.pending_copies),
            lora=req.options.lora,
            lora_slot=req.lora_slot,
        )
        return item, num_draft

    def extend(
        self,
        req: Req,
        target: int,
        masks: list[Any],
        write_start: int | None = None,
        page_copies: tuple = (),
    ) -> PlanItem:
        """req's tokens from computed_len up to target; a pick when the chunk completes the prompt.
        The table row is written from write_start (admission: 0, a new row), by default from
        computed_len or,
        when the row is stale, whole."""
        if write_start is None:
            write_start = self._claim_row(req)
        logits_start = None
        if wants_prompt_logprobs(req):
            logits_start = max(req.logprob_start - 1, 0)
        return PlanItem(
            row=req.kv.table_row,
            new_ids=req.fill_ids[req.kv.computed_len : target],
            computed_len=req.kv.computed_len,
            slots=slots_of(req.kv.page_ids, write_start, target, self.page_size),
            write_start=write_start,
            logits_start=logits_start,
            picks=self._picks(req, [], [], masks) if target == req.seq_len else (),
            prompt_ids=req.origin_input_ids,
            output_ids=req.output_ids,
            top_logprobs_num=req.options.top_logprobs_num,
            page_copies=tuple(page_copies),
            lora=req.lora,
            lora_slot=req.lora_slot,
        )

    def _claim_row(self, req: Req) -> int:
        start = self.memory.table_write_start(req)
        self.memory.row_planned(req)
        return start

    def _picks(
        self, req: Req, draft_ids: list[int], draft_states: list, masks: list[Any]
    ) -> tuple[SampleRow, ...]:
        return sample_rows(req, draft_ids, draft_states, self.eos_ids, masks)
