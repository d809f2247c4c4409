"""The tensors behind the page ids: the per-layer KV pool and the req->slot table.

Which rows and pages are in use is decided in core/ (page_allocator.py); here they are only indexed.
"""
from __future__ import annotations

import torch


class ReqToSlotTable:
    """Row r, column i: the pool slot of token i of the request holding row r.

    Lets attention gather a whole batch's KV indices with one indexing op instead of
    rebuilding Python lists of every slot every step. Rows are handed out by core's TableRows.
    """

    def __init__(self, max_rows: int, max_context: int, device: torch.device | str = "cpu"):
        self.table = torch.zeros((max_rows, max_context), dtype=torch.int64, device=device)
        self.max_context = max_context


class KVCache:
    """K and V per layer: [num_slots, num_kv_heads, head_dim] each."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
