"""The scheduler's batch type: plain data describing one step, and what the runner returns.

The runner turns a list of PlanItem into a ForwardBatch (tensors). Nothing here is a tensor, a
request or a grammar: the runner sees ids, table rows, slots, sampling rows and mask sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.sampling_params import SamplingParams


@dataclass
class SampleRow:
    """One token to pick: how to sample it and what it may be."""

    params: SamplingParams
    output_ids: list[int]  # generated so far (penalties, seeded draws)
    prompt_ids: list[int]  # repetition_penalty covers prompt + output tokens, as HF does
    return_logprob: bool = False
    top_logprobs_num: int = 0
    blocked_ids: list[int] | None = (
        None  # ids that must not be picked (EOS before min_new_tokens, ...)
    )
    mask_source: Any = None  # constrained decoding: an object with fill_mask(row) (None: free)


@dataclass
class PlanItem:
    row: int  # the request's row of the req->slot table
    new_ids: list[int]  # tokens fed this step: fill_ids[prefix_len : prefix_len + len(new_ids)]
    prefix_len: int  # KV already stored before the step
    slots: list[int]  # pool slots of positions [write_start, prefix_len + len(new_ids))
    write_start: int  # 0 on (re)admission, so the table row gets the borrowed prefix too
    logits_start: int | None  # prompt logprobs wanted from this position on (None: last token only)
    picks: list[SampleRow] = field(default_factory=list)
    # tokens to pick: none (a prefill chunk that does not complete the prompt), one after the last
    # fed token, or with a draft one after the request's own last token and one after each draft
    # token (none after a draft token that ends the grammar)
    num_draft: int = 0  # the last num_draft new_ids are a jump-forward draft to verify
    prompt_ids: list[int] = field(default_factory=list)  # the prompt (prompt logprobs score it)
    output_ids: list[int] = field(
        default_factory=list
    )  # generated so far: fill_ids = prompt_ids + output_ids
    top_logprobs_num: int = 0  # top-n prompt logprobs per scored position
    # (source page, destination page): KV the runner copies before the forward (a forked sample's first
    # page of its own, filled from its donor's partial last prompt page: admission.py)
    page_copies: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class ItemResult:
    next_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] | None = None
    # logprobs of fill_ids[p] for the prompt positions p this step scored, in order
    prompt_logprobs: list[tuple[float | None, int]] | None = None
    prompt_top_logprobs: list[list[tuple[float, int]]] | None = None
    # a draft item: the picks at the positions after each draft token (next_id above is the first pick)
    draft_results: list["ItemResult"] | None = None


class PlanItemError(RuntimeError):
    """A step failed because of particular items (their indices in the plan): only their requests fail;
    the step's other requests simply run it again."""

    def __init__(self, indices: list[int], message: str, status: int = 500):
        super().__init__(message)
        self.indices = list(indices)
        self.status = status  # 4xx: the requests asked for something impossible (their fault, not the server's)
