"""Applying sampled tokens to a request, deciding whether it is finished (a FinishReason,
finish_reason.py), and what it may pick next."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.plan import ItemResult, SampleRow
from radixrt.runtime.core.req import Req


def apply_prompt_logprobs(req: Req, item_prefix_len: int, res: ItemResult) -> None:
    """Accumulate the prompt logprobs a step scored (the first prompt token has none)."""
    if req.input_logprobs is None and item_prefix_len <= max(req.logprob_start - 1, 0):
        req.input_logprobs, req.input_top_logprobs = [], []
        if req.logprob_start == 0:
            req.input_logprobs.append([None, req.origin_input_ids[0]])
            req.input_top_logprobs.append([])
    if res.prompt_logprobs:
        req.input_logprobs.extend(list(x) for x in res.prompt_logprobs)
        req.input_top_logprobs.extend(res.prompt_top_logprobs or [[] for _ in res.prompt_logprobs])


def apply_sampled_token(req: Req, res: ItemResult, eos_ids: set[int]) -> FinishReason | None:
    """Append the sampled token; return a finish reason or None."""
    sp = req.sampling
    tok = res.next_id
    req.output_ids.append(tok)
    if req.options.return_logprob:
        req.output_logprobs.append([res.logprob, tok])
        req.output_top_logprobs.append([list(x) for x in res.top_logprobs or []])
    if req.grammar is not None:
        try:
            req.grammar.accept(tok)
        except ValueError as e:
            return FinishReason.abort(f"constraint violated: {e}")
        if req.grammar.is_terminated():
            return FinishReason.stop(tok if tok in eos_ids else None)
    if tok in eos_ids and not sp.ignore_eos:
        return FinishReason.stop(tok)
    if tok in sp.stop_token_ids:
        return FinishReason.stop(tok)
    if req.stop_matcher is not None:
        req.stop_matcher.feed([tok])
        if req.stop_matcher.finished:
            return FinishReason.stop(req.stop_matcher.matched_stop)
    if len(req.output_ids) >= sp.max_new_tokens:
        # incomplete: no complete match fitted the budget (or the backend cannot steer)
        incomplete = req.grammar is not None and not req.grammar.is_final()
        return FinishReason.length_limit(len(req.output_ids), incomplete)
    return None


def sample_rows(
    req: Req,
    draft_ids: list[int],
    draft_states: list[int],
    eos_ids: list[int],
    mask_sources: list[Any],
) -> tuple[SampleRow, ...]:
    """The picks of one step: after the request's last token, and after each draft token but one
    that ends the grammar (the request finishes there; such a row could have nothing allowed, e.g.
    EOS blocked by min_new_tokens). Pick j sees draft tokens 0..j-1 as output (penalties, seeds).
    A constrained row's mask source is appended to mask_sources; the row carries its index."""
    num_picks = 1
    if draft_ids:
        num_picks = len(draft_ids) + (
            req.grammar is None or not req.grammar.ends_at(draft_states[-1])
        )
    rows = []
    for j in range(num_picks):
        output_ids = req.output_ids + draft_ids[:j] if j else req.output_ids
        mask = None
        if req.grammar is not None:
            budget = req.sampling.max_new_tokens - len(output_ids)  # picks left, this one included
            g = req.grammar
            mask = len(mask_sources)
            mask_sources.append(
                g.for_budget(budget) if j == 0 else g.at(draft_states[j - 1], budget)
            )
        rows.append(
            SampleRow(
                params=req.sampling,
                output_ids=output_ids,
                prompt_ids=req.origin_input_ids,
                return_logprob=req.options.return_logprob,
                top_logprobs_num=req.options.top_logprobs_num,
                blocked_ids=blocked_ids(req, len(output_ids), eos_ids),
                mask=mask,
                beam_candidates=0 if req.beam is None else req.beam.num_candidates,
            )
        )
    return tuple(rows)


def blocked_ids(req: Req, num_output: int, eos_ids: list[int]) -> list[int] | None:
    """Before min_new_tokens, nothing that would end the request may be picked."""
    sp = req.sampling
    if num_output < sp.min_new_tokens and not sp.ignore_eos:
        return eos_ids + list(sp.stop_token_ids)
    return None
