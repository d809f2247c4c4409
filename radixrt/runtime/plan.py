"""The scheduler's batch type: plain data describing one step, and what the runner returns.

The runner turns a list of PlanItem into a ForwardBatch (tensors); nothing here is a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixrt.runtime.req import Req


@dataclass
class PlanItem:
    req: Req
    new_ids: list[int]          # tokens fed this step: fill_ids[prefix_len : prefix_len + len(new_ids)]
    prefix_len: int             # == req.kv_len before the step
    slots: list[int]            # pool slots of positions [write_start, prefix_len + len(new_ids))
    write_start: int            # 0 on (re)admission, so the table row gets the borrowed prefix too
    logits_start: int | None    # prompt logprobs wanted from this position on (None: last token only)
    sample: bool                # this step completes the request's tokens: sample the next one
    num_draft: int = 0          # the last num_draft new_ids are a jump-forward draft: pick a token at every
                                # new position (the draft is kept up to the first pick that differs)

    @property
    def is_decode(self) -> bool:
        return len(self.new_ids) == 1 and self.logits_start is None and self.prefix_len > 0


@dataclass
class ItemResult:
    next_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None
    # logprobs of fill_ids[p] for the prompt positions p this step scored, in order
    prompt_logprobs: list[tuple[float | None, int]] | None = None
    prompt_top_logprobs: list[list[tuple[float, int]]] | None = None
    extra: Any = None
    # a draft item: the picks at the positions after each draft token (next_id above is the first pick)
    draft_results: list["ItemResult"] | None = None
