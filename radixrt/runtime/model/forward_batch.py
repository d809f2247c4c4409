"""The runner's forward inputs: tensors for one forward, built once per step from the plan.

Requests are ordered decode first (one new token each), then extends (prefill chunks or
extensions of a cached prefix); the layout is AttentionBatch's (kernels/attention_batch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixrt.kernels.attention_batch import AttentionBatch


@dataclass(kw_only=True)
class ForwardBatch(AttentionBatch):
    """The attention layout (kernels/attention_batch.py) plus what the model itself reads."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    logits_rows: torch.Tensor  # [R] int64 rows of T whose logits are wanted

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class BatchItem:
    """Plain-data description of one request's part of a forward (from the scheduler's plan)."""

    row: int  # req->slot table row
    new_ids: list[int]  # tokens fed this step
    prefix_len: int  # KV already stored (positions of new_ids start here)
    slots: list[int]  # pool slots of positions [write_start, prefix_len + len(new_ids))
    write_start: int  # first position whose slot is (re)written into the table
    logits_start: int | None = None  # None: logits for the last new token only;
    # k: logits for every new token at position >= k too


def build_forward_batch(
    items: list[BatchItem], req_to_slot: torch.Tensor, device: torch.device | str = "cpu"
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
    write_rows: list[int] = []
    write_cols: list[int] = []
    write_slots: list[int] = []
    num_decode = 0
    for it in items:
        n = len(it.new_ids)
        assert n >= 1, "every item feeds at least one token"
        seq_len = it.prefix_len + n
        assert len(it.slots) == seq_len - it.write_start, (len(it.slots), seq_len, it.write_start)
        if (
            n == 1
            and it.logits_start is None
            and len(extend_lens) == num_decode
            and it.prefix_len > 0
        ):
            num_decode += 1
        start = qo_indptr[-1]
        input_ids.extend(it.new_ids)
        positions.extend(range(it.prefix_len, seq_len))
        out_slots.extend(it.slots[it.prefix_len - it.write_start :])
        write_rows.extend([it.row] * len(it.slots))
        write_cols.extend(range(it.write_start, seq_len))
        write_slots.extend(it.slots)
        rows.append(it.row)
        seq_lens.append(seq_len)
        prefix_lens.append(it.prefix_len)
        extend_lens.append(n)
        qo_indptr.append(start + n)
        if it.logits_start is not None:
            first = max(it.logits_start, it.prefix_len)
            logits_rows.extend(range(start + first - it.prefix_len, start + n - 1))
        logits_rows.append(start + n - 1)

    def t(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    req_to_slot[t(write_rows), t(write_cols)] = t(write_slots)
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
