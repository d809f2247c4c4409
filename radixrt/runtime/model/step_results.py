"""From a step's logits to its results: which logits rows are picks, the constrained rows' masks,
sampling, and the prompt logprobs an item asked for."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from radixrt.runtime.core.plan import ItemResult, PlanItem, PlanItemError
from radixrt.runtime.model.beam_offers import beam_offers
from radixrt.runtime.model.sampler import NoAllowedTokenError, sample

# fill_masks(sources, vocab_size, device) -> [len(sources), vocab] bool (constrained/state.py's)
MaskFiller = Callable[[list[Any], int, torch.device], torch.Tensor]


def pick_positions(plan: list[PlanItem], logits: torch.Tensor, results: list[ItemResult]):
    """Logits rows to sample and, for each, (plan index, pick index); fills prompt logprobs."""
    pick_rows: list[int] = []
    picks: list[tuple[int, int]] = []  # pick 0 follows the last fed token, pick j draft token j
    row = 0
    for i, it in enumerate(plan):
        end = it.computed_len + len(it.new_ids)  # positions computed_len..end-1 were fed
        if it.num_draft:
            first_pick = row + len(it.new_ids) - 1 - it.num_draft
            pick_rows.extend(range(first_pick, first_pick + len(it.picks)))
            picks.extend((i, j) for j in range(len(it.picks)))
            row += len(it.new_ids)
            continue
        if it.logits_start is not None:
            first = min(max(it.logits_start, it.computed_len), end - 1)
            scored = prompt_logprobs(it, logits[row : row + end - first], first)
            results[i].prompt_logprobs, results[i].prompt_top_logprobs = scored
            row += end - first
        else:
            row += 1
        if it.picks:
            pick_rows.append(row - 1)
            picks.append((i, 0))
    return pick_rows, picks


def step_results(
    plan: list[PlanItem],
    logits: torch.Tensor,
    mask_sources: Sequence[Any],
    fill_masks: MaskFiller | None,
    vocab_size: int,
) -> list[ItemResult]:
    results = [ItemResult() for _ in plan]
    pick_rows, picks = pick_positions(plan, logits, results)
    if not picks:
        return results
    rows = [plan[i].picks[j] for i, j in picks]
    mask = None
    if any(r.mask is not None for r in rows):
        if fill_masks is None:
            raise PlanItemError(sorted({i for i, _ in picks}), "this runner has no mask filler")
        sources = [None if r.mask is None else mask_sources[r.mask] for r in rows]
        mask = fill_masks(sources, vocab_size, logits.device)
    last = logits if len(pick_rows) == logits.shape[0] else logits[pick_rows]
    try:
        out = sample(last, rows, mask)
    except NoAllowedTokenError as e:  # only the requests of those rows fail, as bad requests
        raise no_token_error(e, rows, picks) from None
    beam_rows = [k for k, r in enumerate(rows) if r.beam_candidates]
    if beam_rows:  # a beam has no draft: its pick is its item's first
        for k, offers in zip(beam_rows, beam_offers(last, rows, beam_rows, mask)):
            results[picks[k][0]].beam_offers = offers
    for k, (i, j) in enumerate(picks):
        res = results[i] if j == 0 else ItemResult()
        res.next_id = out.next_ids[k]
        if out.logprobs is not None:
            res.logprob = out.logprobs[k]
        if out.top_logprobs is not None:
            res.top_logprobs = out.top_logprobs[k]
        if j:
            if results[i].draft_results is None:
                results[i].draft_results = []
            results[i].draft_results.append(res)
    return results


def no_token_error(e: NoAllowedTokenError, rows: list, picks: list) -> PlanItemError:
    blocked = any(rows[k].blocked_ids for k in e.rows)
    why = (
        "its constraint allows only its end here and min_new_tokens (or a stop token id it may not "
        "reach before the minimum) forbids ending"
        if blocked
        else "its constraint allows no token here"
    )
    return PlanItemError(
        sorted({picks[k][0] for k in e.rows}),
        f"no token satisfies the request's constraint and sampling parameters together: {why}",
        status=400,
    )


def prompt_logprobs(it: PlanItem, logits: torch.Tensor, first: int):
    """Logprobs of the prompt tokens that follow positions first..end-1 (rows of `logits`)."""
    prompt = it.prompt_ids
    positions = [
        q
        for q in range(first, first + logits.shape[0])
        if q >= it.logits_start and q + 1 < len(prompt)
    ]
    if not positions:
        return None, None
    lp = torch.log_softmax(logits[positions[0] - first : positions[-1] - first + 1].float(), dim=-1)
    targets = torch.tensor([prompt[q + 1] for q in positions], device=lp.device)
    chosen = lp.gather(1, targets[:, None])[:, 0].tolist()
    logprobs = [(c, prompt[q + 1]) for c, q in zip(chosen, positions)]
    tops = None
    if it.top_logprobs_num > 0:
        vals, ids = lp.topk(it.top_logprobs_num, dim=-1)
        tops = [list(zip(v, t)) for v, t in zip(vals.tolist(), ids.tolist())]
    return logprobs, tops
