"""What the sampler does to the logits before it chooses (steps 1 and 2 of sampler.py's order).

Masks: a constrained-decoding mask and each row's blocked ids set tokens to -inf. Penalties:
repetition_penalty (HF) over prompt and output tokens, frequency/presence penalties (OpenAI) over
output tokens, then logit_bias, all as scatters over the tokens involved, never B x V work.
"""

from __future__ import annotations

import torch

from radixrt.runtime.core.plan import SampleRow


def apply_masks(
    logits: torch.Tensor, rows: list[SampleRow], allowed_mask: torch.Tensor | None
) -> torch.Tensor:
    """A new tensor with disallowed (mask False) and blocked ids set to -inf."""
    if allowed_mask is not None:
        assert allowed_mask.shape == logits.shape and allowed_mask.dtype == torch.bool, (
            tuple(allowed_mask.shape),
            allowed_mask.dtype,
        )
        out = torch.where(allowed_mask, logits, float("-inf"))
    else:
        out = logits.clone()
    vocab_size = logits.shape[1]
    flat_idx = [
        i * vocab_size + t for i, r in enumerate(rows) if r.blocked_ids for t in r.blocked_ids
    ]
    if flat_idx:
        assert all(0 <= t < vocab_size for r in rows if r.blocked_ids for t in r.blocked_ids), (
            "blocked id out of range"
        )
        out.view(-1).index_fill_(0, index_tensor(flat_idx, logits.device), float("-inf"))
    return out


def apply_penalties(
    logits: torch.Tensor, rows: list[SampleRow], in_place: bool = False
) -> torch.Tensor:
    """repetition_penalty (HF: seen logit > 0 is divided, else multiplied) over prompt+output
    tokens, then logit -= frequency_penalty * count + presence_penalty * (count > 0) over output
    tokens (OpenAI), then logit += logit_bias[token] (OpenAI).

    Scatter ops on the flat (row * V + token) indices of the rows that have penalties, so the cost
    is the number of tokens, not B * V. Duplicate indices are fine: index_put_ writes the same value
    computed from the pre-update logit for every duplicate, and index_add_ adds one -frequency each.
    Returns `logits` itself when nothing applies; otherwise a modified copy unless in_place.
    """
    rep_rows = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    out_rows = [
        i
        for i, r in enumerate(rows)
        if r.output_ids and (r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0)
    ]
    bias_rows = [i for i, r in enumerate(rows) if r.params.logit_bias]
    if not rep_rows and not out_rows and not bias_rows:
        return logits
    out = logits if in_place else logits.clone(memory_format=torch.contiguous_format)
    flat = out.view(-1)  # [B * V]; in_place callers pass a contiguous tensor
    vocab_size = logits.shape[1]
    if rep_rows:
        idx, pen = _flat_indices(
            rep_rows,
            [rows[i].prompt_ids + rows[i].output_ids for i in rep_rows],
            [[rows[i].params.repetition_penalty] for i in rep_rows],
            vocab_size,
            out.device,
        )
        vals = flat[idx]
        flat[idx] = torch.where(vals > 0, vals / pen[0], vals * pen[0])
    if out_rows:
        idx, pen = _flat_indices(
            out_rows,
            [rows[i].output_ids for i in out_rows],
            [[rows[i].params.presence_penalty, rows[i].params.frequency_penalty] for i in out_rows],
            vocab_size,
            out.device,
        )
        flat[idx] = flat[idx] - pen[0]
        flat.index_add_(0, idx, -pen[1])
    # token ids are unique per row (canonical decimal keys) and checked < V at the request edge
    if bias_rows:
        pairs = [
            (i * vocab_size + t, b) for i in bias_rows for t, b in rows[i].params.logit_bias_pairs()
        ]
        flat.index_add_(
            0,
            index_tensor([f for f, _ in pairs], out.device),
            torch.tensor([b for _, b in pairs], dtype=out.dtype).to(out.device),
        )
    return out


def _flat_indices(
    row_ids: list[int],
    token_lists: list[list[int]],
    row_values: list[list[float]],
    vocab_size: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices row * V + token for every token of every row, and each row's values repeated per
    token ([num_values, N]). Built on the CPU, one copy each to the device."""
    lens = torch.tensor([len(t) for t in token_lists])
    tokens = torch.tensor([t for ts in token_lists for t in ts], dtype=torch.int64)
    assert tokens.numel() == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < vocab_size), (
        "token id out of range"
    )
    flat = torch.tensor(row_ids, dtype=torch.int64).repeat_interleave(lens) * vocab_size + tokens
    # [num_values, N]
    values = torch.tensor(row_values, dtype=torch.float32).repeat_interleave(lens, dim=0).T
    return flat.to(device, non_blocking=True), values.contiguous().to(device, non_blocking=True)


def index_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """Host ints as an int64 tensor on `device` (one copy, not waited for)."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)
