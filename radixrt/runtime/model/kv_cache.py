"""The tensors behind the page ids: the per-layer KV pool and the req->slot table.

Which rows and pages are in use is decided in core/ (page_allocator.py); here they are only indexed.
"""

from __future__ import annotations

import torch

from radixrt.kernels.kv_quant import is_quantized


class ReqToSlotTable:
    """Row r, column i: the pool slot of token i of the request holding row r.

    Lets attention gather a whole batch's KV indices with one indexing op instead of
    rebuilding Python lists of every slot every step. Rows are handed out by core's TableRows.
    """

    def __init__(self, max_rows: int, max_context: int, device: torch.device | str = "cpu"):
        self.table = torch.zeros((max_rows, max_context), dtype=torch.int64, device=device)
        self.max_context = max_context


class KVCache:
    """K and V per layer: [num_slots, num_kv_heads, head_dim] each; with an int8 / fp8 dtype also a
    float32 scale per token per KV head, [num_slots, num_kv_heads] (kernels/kv_quant.py)."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        shape = (num_slots, num_kv_heads, head_dim)
        # one tensor over all layers, [layers, slots, Hkv, D], each layer's K a contiguous view:
        # the whole-step graph (step_graph.py) reads every layer from one input and its new keys
        # are written with one copy
        self.k_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.v_all = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.k, self.v = list(self.k_all.unbind(0)), list(self.v_all.unbind(0))
        self.k_scale = self.v_scale = None
        if is_quantized(dtype):
            self.k_scale = [
                torch.ones(shape[:2], dtype=torch.float32, device=device) for _ in range(num_layers)
            ]
            self.v_scale = [
                torch.ones(shape[:2], dtype=torch.float32, device=device) for _ in range(num_layers)
            ]
        self.num_slots = num_slots
        self.dtype = dtype

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor of the pool: each layer's K, then V, then (quantised) their
        scales."""
        return [
            t for group in (self.k, self.v, self.k_scale or [], self.v_scale or []) for t in group
        ]

    def page_bytes(self, page_size: int) -> int:
        """Bytes one page holds over all of tensors() (what a copy of the page moves)."""
        return sum(t[0].numel() * t.element_size() for t in self.tensors()) * page_size

    def copy_pages(self, pairs: list[tuple[int, int]], page_size: int) -> None:
        """Copy the K/V (and scales) of each (source, destination) page, every layer."""
        if not pairs:
            return
        offsets = torch.arange(page_size)
        src = torch.cat([offsets + s * page_size for s, _ in pairs]).to(self.k[0].device)
        dst = torch.cat([offsets + d * page_size for _, d in pairs]).to(self.k[0].device)
        for t in self.tensors():
            t[dst] = t[src]

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.k_scale is None:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        per_head = head_dim * torch.empty((), dtype=dtype).element_size() + (
            4 if is_quantized(dtype) else 0
        )
        return 2 * num_layers * num_kv_heads * per_head
