"""The runner's forward inputs: tensors for one forward, built once per step from the plan.

Requests are ordered decode first (one new token each), then extends (prefill chunks or
extensions of a cached prefix); the layout is AttentionBatch's (kernels/attention_batch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention_batch import AttentionBatch
from radixrt.runtime.core.plan import PlanItem


@dataclass(kw_only=True)
class ForwardBatch(AttentionBatch):
    """The attention layout (kernels/attention_batch.py) plus what the model itself reads."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    logits_rows: torch.Tensor  # [R] int64 rows of T whose logits are wanted

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def build_forward_batch(
    items: list[PlanItem], req_to_slot: torch.Tensor, device: torch.device | str = "cpu"
) -> ForwardBatch:
    """Decode items (one new token) must come first. Writes the table rows, builds the tensors."""
    input_ids: list[int] = []
    positions: list[int] = []
    out_slots: list[int] = []
    rows: list[int] = []
    seq_lens: list[int] = []
    prefix_lens: list[int] = []
    extend_lens: list[int] = []
    qo_indptr = [0]
    logits_rows: list[int] = []
    num_decode = 0
    for it in items:
        n = len(it.new_ids)
        assert n >= 1, "every item feeds at least one token"
        seq_len = it.computed_len + n
        assert len(it.slots) == seq_len - it.write_start, (len(it.slots), seq_len, it.write_start)
        if (
            n == 1
            and it.logits_from is None
            and len(extend_lens) == num_decode
            and it.computed_len > 0
        ):
            num_decode += 1
        start = qo_indptr[-1]
        input_ids.extend(it.new_ids)
        positions.extend(range(it.computed_len, seq_len))
        out_slots.extend(it.slots[it.computed_len - it.write_start :])
        rows.append(it.row)
        seq_lens.append(seq_len)
        prefix_lens.append(it.computed_len)
        extend_lens.append(n)
        qo_indptr.append(start + n)
        if it.logits_from is not None:
            first = max(it.logits_from, it.computed_len)
            logits_rows.extend(range(start + first - it.computed_len, start + n - 1))
        logits_rows.append(start + n - 1)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    write_table_rows(items, req_to_slot, t)
    return ForwardBatch(
        input_ids=t(input_ids),
        positions=t(positions),
        out_slots=t(out_slots),
        req_rows=t(rows),
        seq_lens=t(seq_lens),
        prefix_lens=t(prefix_lens),
        extend_lens=t(extend_lens),
        qo_indptr=t(qo_indptr),
        logits_rows=t(logits_rows),
        num_decode=num_decode,
        seq_lens_list=seq_lens,
        extend_lens_list=extend_lens,
        req_to_slot=req_to_slot,
    )


def write_table_rows(items: list[PlanItem], req_to_slot: torch.Tensor, t) -> None:
    """Each item's slots of positions [write_start, computed_len + len(new_ids)) into its table
    row."""
    rows = [it.row for it in items for _ in it.slots]
    cols = [pos for it in items for pos in range(it.write_start, it.write_start + len(it.slots))]
    req_to_slot[t(rows), t(cols)] = t([slot for it in items for slot in it.slots])
