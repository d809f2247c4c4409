"""A beam's pick: its best continuations for the search (core/beam_search.py), not a draw.

log_softmax of the raw logits, then the grammar mask and blocked ids as -inf without renormalising:
what transformers' beam search scores (its logits processors run on the log-probabilities)."""

from __future__ import annotations

import torch

from radixrt.runtime.core.plan import SampleRow
from radixrt.runtime.model.sampler_logits import index_tensor


def beam_offers(
    logits: torch.Tensor,
    rows: list[SampleRow],
    beam_rows: list[int],
    allowed_mask: torch.Tensor | None,
) -> list[list[tuple[float, int]]]:
    """For each row in beam_rows (indices into rows / logits), its best beam_candidates (logprob,
    id) pairs, best first, ids it may not pick left out."""
    sel = index_tensor(beam_rows, logits.device)
    lp = torch.log_softmax(logits.index_select(0, sel).float(), dim=-1)
    if allowed_mask is not None:
        lp.masked_fill_(~allowed_mask.index_select(0, sel), float("-inf"))
    for j, k in enumerate(beam_rows):
        if rows[k].blocked_ids:
            lp[j, rows[k].blocked_ids] = float("-inf")
    width = min(max(rows[k].beam_candidates for k in beam_rows), lp.shape[1])
    vals, ids = lp.topk(width, dim=-1, sorted=True)
    offers = []
    for j, (v_row, i_row) in enumerate(zip(vals.tolist(), ids.tolist())):
        n = rows[beam_rows[j]].beam_candidates
        # left out: masked ids (-inf) and a broken row's NaNs (a beam with no offer ends)
        offers.append([(v, i) for v, i in zip(v_row[:n], i_row[:n]) if v > float("-inf")])
    return offers
