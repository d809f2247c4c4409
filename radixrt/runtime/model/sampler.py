"""Batched next-token sampling: masks, penalties, temperature/top-k/top-p/min-p, seeds, logprobs.

The model runner calls `sample` once per step with one logits row per request that needs a
next token. Order of work, per row (what HF `generate` and the OpenAI API do):

  1. constrained-decoding mask and `blocked_ids` -> -inf          (before everything else)
  2. repetition_penalty on prompt+output tokens (HF), then frequency/presence on output tokens
     (OpenAI), then logit_bias (OpenAI: added to the logit)
  3. greedy rows (temperature 0 or top_k 1): argmax
  4. sampled rows: softmax(logits / temperature); keep top_k; keep the top_p nucleus of what is
     left (renormalised, as HF's warpers chain); drop tokens below min_p * max prob; draw. The draw
     is the exponential race argmax(probs / Exp(1)) on a GPU and a two-level inverse CDF on a CPU
     (same distribution; a CPU makes exponential noise slowly).

Seeds: a row with `params.seed` draws from a generator seeded by (seed, len(output_ids)), so its
token does not depend on the batch, the global RNG, or a preemption in between (same device).

Logprobs are log_softmax of the RAW logits (before mask, penalties, temperature), as SGLang reports
them by default. Everything stays on the logits' device; the only host sync is one `.tolist()` of
the chosen ids (plus the logprob tensors when a row asked for them).

Steps 1 and 2 are sampler_logits.py's, the draw of step 4 sampler_draw.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.runtime.core.plan import SampleRow
from radixrt.runtime.model.sampler_draw import draw_inverse_cdf, draw_race, use_race
from radixrt.runtime.model.sampler_logits import apply_masks, apply_penalties, index_tensor
from radixrt.runtime.request.sampling_params import SamplingParams


class NoAllowedTokenError(AssertionError):
    """Rows whose grammar mask and blocked ids exclude every token: a bug upstream, but only
    theirs."""

    def __init__(self, rows: list[int]):
        super().__init__(
            f"sampler: rows {rows} have no allowed token (grammar mask and blocked_ids exclude all)"
        )
        self.rows = rows


@dataclass
class SampleResult:
    next_ids: list[int]
    # Both are None when no row asked; otherwise one entry per row, None for rows that did not ask
    # (a row asks with return_logprob or top_logprobs_num > 0). top_logprobs entries are
    # [(logprob, token_id), ...] sorted by logprob descending, top_logprobs_num long.
    logprobs: list[float | None] | None
    top_logprobs: list[list[tuple[float, int]] | None] | None


def sample(
    logits: torch.Tensor, rows: list[SampleRow], allowed_mask: torch.Tensor | None = None
) -> SampleResult:
    """logits: [B, V] float32, never modified. allowed_mask: optional [B, V] bool, True =
    allowed."""
    assert logits.dim() == 2 and logits.shape[0] == len(rows), (tuple(logits.shape), len(rows))
    num_rows, vocab_size = logits.shape
    raw = logits
    if raw.dtype != torch.float32 or not raw.is_contiguous():  # flat (row * V + id) views need both
        raw = raw.float().contiguous()
    lp_rows = [i for i, r in enumerate(rows) if r.return_logprob or r.top_logprobs_num > 0]
    has_mask = allowed_mask is not None or any(r.blocked_ids for r in rows)

    x = apply_masks(raw, rows, allowed_mask) if has_mask else raw  # out of place: raw stays raw
    x = apply_penalties(x, rows, in_place=x is not raw)

    sampled_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if has_mask:  # max gives the greedy ids and, in one pass, the rows left with no allowed token
        max_vals, next_ids = x.max(dim=-1)
    elif len(sampled_rows) < num_rows:
        # the common case, all greedy: this one kernel and the .tolist(); max(dim) gives argmax's
        # first index at 3x its speed on a CPU (0.17 vs 0.51 ms for 16 x 49,152)
        next_ids = x.max(dim=-1)[1]
    if len(sampled_rows) == num_rows:
        next_ids = _sample_rows(x, rows)
    elif sampled_rows:
        sel = index_tensor(sampled_rows, x.device)
        next_ids.index_copy_(
            0, sel, _sample_rows(x.index_select(0, sel), [rows[i] for i in sampled_rows])
        )
    if has_mask:  # flag fully masked rows as -1 so the check costs no extra sync
        next_ids = torch.where(max_vals > float("-inf"), next_ids, -1)

    next_list = next_ids.tolist()
    if has_mask:
        bad = [i for i, t in enumerate(next_list) if t < 0]
        if bad:
            raise NoAllowedTokenError(bad)
    if not lp_rows:
        return SampleResult(next_list, None, None)
    logprobs, top_logprobs = _logprobs(raw, rows, lp_rows, next_ids)
    return SampleResult(next_list, logprobs, top_logprobs)


def _sample_rows(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """Draw one id per row from [S, V] logits of non-greedy rows; returns [S] int64 ids."""
    probs = truncated_probs(logits, rows)
    # second line of defence (the edge bounds temperature and penalties): a row whose
    # probabilities are NaN or sum to nothing picks its largest finite logit instead of breaking
    # the draw
    bad = ~(probs.sum(dim=-1) > 0)  # NaN compares False
    if bool(bad.any()):
        rows_bad = bad.nonzero().squeeze(1)
        fallback = torch.nan_to_num(logits.index_select(0, rows_bad), nan=float("-inf")).argmax(
            dim=-1
        )
        probs[rows_bad] = 0.0
        probs[rows_bad, fallback] = 1.0
    seeded = [
        (i, r.params.seed, len(r.output_ids))
        for i, r in enumerate(rows)
        if r.params.seed is not None
    ]
    if use_race(probs.device):
        return draw_race(probs, seeded)
    return draw_inverse_cdf(probs, seeded)


def truncated_probs(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """softmax(logits / temperature) with the tokens cut by top_k, top_p, min_p set to 0 (not
    renormalised; both draws take unnormalised weights). Rows must not be greedy.

    The cut is a per-row probability threshold (keep p >= threshold; HF's top-k also keeps ties),
    so the distribution stays in vocabulary order and a seeded row's draw depends on its own row
    only, never on how the batch happened to be sorted."""
    num_rows, vocab_size = logits.shape
    params = [r.params for r in rows]
    assert not any(p.is_greedy for p in params)
    top_ks = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
    has_k = [k < vocab_size for k in top_ks]
    temperature, top_k, top_p, min_p, kp_row = _row_table(params, top_ks, has_k, logits.device)

    if any(p.temperature != 1.0 for p in params):
        logits = logits / temperature
    probs = torch.softmax(logits, dim=-1)
    threshold = max_prob = None
    if any(has_k) or any(p.top_p < 1.0 for p in params):
        threshold, max_prob = _top_k_top_p_threshold(
            probs, params, top_ks, has_k, (top_k, top_p, kp_row)
        )
    if any(p.min_p > 0.0 for p in params):
        max_prob = probs.amax(dim=-1, keepdim=True) if max_prob is None else max_prob
        threshold = (
            max_prob * min_p if threshold is None else torch.maximum(threshold, max_prob * min_p)
        )
    if threshold is not None:
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _row_table(
    params: list[SamplingParams], top_ks: list[int], has_k: list[bool], device: torch.device
) -> torch.Tensor:
    """The per-row parameters in one host->device copy: [5, S, 1] = temperature, top_k, top_p
    (inf when off: no rounding cut), min_p, and 1 for rows with a top-k or top-p cut."""
    table = torch.tensor(
        [
            [p.temperature for p in params],
            top_ks,
            [p.top_p if p.top_p < 1.0 else float("inf") for p in params],
            [p.min_p for p in params],
            [float(k or p.top_p < 1.0) for p, k in zip(params, has_k)],
        ],
        dtype=torch.float32,
    ).to(device, non_blocking=True)
    return table.unsqueeze(2)


def _top_k_top_p_threshold(
    probs: torch.Tensor,
    params: list[SamplingParams],
    top_ks: list[int],
    has_k: list[bool],
    columns: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's probability threshold for its top-k and top-p cuts (0 for rows with neither) and
    its largest probability. columns: the top_k, top_p and cut-row columns of _row_table, [S, 1]."""
    top_k, top_p, kp_row = columns
    vocab_size = probs.shape[1]
    p_only = [p.top_p < 1.0 and not k for p, k in zip(params, has_k)]  # nucleus may span the vocab
    vals = _sorted_prefix(
        probs, max((k for k, h in zip(top_ks, has_k) if h), default=0), p_only, params
    )
    position = torch.arange(vals.shape[1], device=probs.device, dtype=torch.float32)
    in_k = position < top_k
    vals_k = vals.masked_fill(~in_k, 0.0)
    cum = vals_k.cumsum(dim=-1)
    # top-p runs on the top-k renormalised distribution (HF chains the warpers): the mass of a
    # top-k row is its prefix sum, of any other row the whole distribution (1).
    mass = torch.where(top_k < vocab_size, cum[:, -1:], 1.0)
    keep = in_k & (cum - vals_k <= top_p * mass)  # a prefix; the first token always stays
    num_keep = keep.sum(dim=-1, keepdim=True)
    # clamp: a NaN row keeps nothing (the draw falls back to its argmax, see _sample_rows);
    # rows with neither cut get threshold 0
    threshold = vals.gather(1, (num_keep - 1).clamp_min_(0)) * kp_row
    return threshold, vals[:, :1]


# A full sort of 32 x 49152 costs ~100 ms on a CPU core and topk(1024) ~10 ms.
CPU_NUCLEUS_CANDIDATES = 1024


def _sorted_prefix(
    probs: torch.Tensor, max_k: int, p_only: list[bool], params: list[SamplingParams]
) -> torch.Tensor:
    """Descending probabilities [S, W], wide enough for every row's top-k and top-p cut.

    Only rows with top_p and no top_k may need the whole vocabulary: a GPU sorts it; a CPU first
    tries the top CPU_NUCLEUS_CANDIDATES and checks (host syncs cost nothing there) that each such
    row's nucleus closed inside them, i.e. their mass exceeds top_p, so every later token is cut."""
    vocab_size = probs.shape[1]
    if not any(p_only):
        return probs.topk(max_k, dim=-1, sorted=True).values
    width = max(max_k, CPU_NUCLEUS_CANDIDATES)
    if probs.device.type == "cpu" and width * 4 <= vocab_size:
        vals = probs.topk(width, dim=-1, sorted=True).values
        prefix_mass = vals.sum(dim=-1).tolist()
        if all(m > p.top_p for m, p, only in zip(prefix_mass, params, p_only) if only):
            return vals
    return probs.sort(dim=-1, descending=True).values


def _logprobs(
    raw: torch.Tensor, rows: list[SampleRow], lp_rows: list[int], next_ids: torch.Tensor
) -> tuple[list[float | None], list[list[tuple[float, int]] | None]]:
    """log_softmax of the raw logits at the chosen ids, and the top-n (logprob, id) pairs."""
    if len(lp_rows) == len(rows):
        lp, chosen = torch.log_softmax(raw, dim=-1), next_ids
    else:
        sel = index_tensor(lp_rows, raw.device)
        lp, chosen = (
            torch.log_softmax(raw.index_select(0, sel), dim=-1),
            next_ids.index_select(0, sel),
        )
    chosen_lp = lp.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
    num_top = max(rows[i].top_logprobs_num for i in lp_rows)
    top_vals: list[list[float]] = []
    top_ids: list[list[int]] = []
    if num_top > 0:
        vals, ids = lp.topk(min(num_top, lp.shape[1]), dim=-1, sorted=True)
        top_vals, top_ids = vals.tolist(), ids.tolist()
    logprobs: list[float | None] = [None] * len(rows)
    top_logprobs: list[list[tuple[float, int]] | None] = [None] * len(rows)
    for j, i in enumerate(lp_rows):
        logprobs[i] = chosen_lp[j]
        n = rows[i].top_logprobs_num
        top_logprobs[i] = list(zip(top_vals[j][:n], top_ids[j][:n])) if n > 0 else []
    return logprobs, top_logprobs
