"""What attention needs to know about a batch: where each request's KV lives and which rows of the
flat token axis are its queries. Plain tensors and ints, so the kernels depend on nothing else.

Requests are ordered decode first (one new token each), then extends. Request b's new tokens are
rows `qo_indptr[b]:qo_indptr[b+1]` of the flat token axis T, at positions
`prefix_lens[b] ... seq_lens[b]-1`. Its KV slots for positions `0..seq_lens[b]-1` are
`req_to_slot[req_rows[b], :seq_lens[b]]`; the new tokens' K/V are written to `out_slots`
(same order as T) before attention reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(kw_only=True)
class AttentionBatch:
    out_slots: torch.Tensor  # [T] int64 pool slot for each new token's K/V
    req_rows: torch.Tensor  # [B] int64 rows of the req->slot table
    seq_lens: torch.Tensor  # [B] int64 KV length after this step (prefix + new)
    prefix_lens: torch.Tensor  # [B] int64 KV already stored before this step
    extend_lens: torch.Tensor  # [B] int64 new tokens (1 for decode)
    qo_indptr: torch.Tensor  # [B+1] int64 offsets of each request's rows in T
    num_decode: int  # the first num_decode requests are decode (extend_len 1)
    seq_lens_list: list[int]  # python copies, so backends need no .item()/.tolist() syncs
    extend_lens_list: list[int]
    req_to_slot: torch.Tensor  # [max_rows, max_context] int64 slot table
    attn_meta: Any = None  # set once per forward by the attention backend's init_forward_metadata
    # the torch backend's plan for sliding-window layers (on their first call)
    window_meta: Any = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_list)
