"""The adapters a forward can use: --max-loras-per-batch slots of stacked LoRA weights, and one
forward's application of them (LoraStep).

A slot holds one adapter's A and B per (layer, target), zero-padded to --max-lora-rank, so every
slot's tensors have one shape. Which adapter sits in which slot is the scheduler's decision
(core/lora_slots.py: least recently used among slots no running request holds); the plan names it
per item (PlanItem.lora_slot / lora_name) and the runner copies an adapter in when its slot held
another. A forward's rows are grouped by slot; each group's update is one pair of matmuls per
target, (x_g @ A^T) @ B^T * scaling, added to the base projection's output (no weights merged).
"""

from __future__ import annotations

import torch

from radixrt.runtime.model.lora_adapter import LoraAdapter, TargetDims


class LoraPool:
    def __init__(
        self,
        dims: TargetDims,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        L, S, R = dims.num_layers, num_slots, max_rank
        self.a = {
            t: torch.zeros(L, S, R, i, dtype=dtype, device=device)
            for t, (i, _) in dims.dims.items()
        }
        self.b = {
            t: torch.zeros(L, S, o, R, dtype=dtype, device=device)
            for t, (_, o) in dims.dims.items()
        }
        self.names: list[str | None] = [None] * S
        self.ranks = [0] * S
        self.scalings = [0.0] * S
        self.present: list[set[tuple[int, str]]] = [set() for _ in range(S)]

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy adapter into slot (what was there is overwritten)."""
        for target in self.a:
            self.a[target][:, slot].zero_()
            self.b[target][:, slot].zero_()
        for (layer, target), (a, b) in adapter.weights.items():
            r = a.shape[0]
            self.a[target][layer, slot, :r].copy_(a)
            self.b[target][layer, slot, :, :r].copy_(b)
        self.names[slot], self.ranks[slot] = adapter.name, adapter.rank
        self.scalings[slot] = adapter.scaling
        self.present[slot] = set(adapter.weights)

    def clear(self, name: str) -> None:
        """An unloaded adapter leaves its slot (the slot's weights stay until overwritten)."""
        for slot, held in enumerate(self.names):
            if held == name:
                self.names[slot], self.present[slot] = None, set()


class LoraStep:
    """One forward's LoRA rows: for each slot in use, the token rows of the items naming it."""

    def __init__(
        self, pool: LoraPool, groups: list[tuple[int, torch.Tensor]], row_slots: list[int]
    ):
        self.pool = pool
        self.groups = groups
        device = groups[0][1].device
        # the GPU kernel's view: every row's slot (-1: the base model) and the slots' scalings
        self.on_gpu = device.type == "cuda"
        if self.on_gpu:
            self.row_slots = torch.tensor(row_slots, dtype=torch.int32, device=device)
            self.scalings = torch.tensor(pool.scalings, dtype=torch.float32, device=device)

    @classmethod
    def for_items(
        cls, pool: LoraPool, slots: list[int | None], lengths: list[int], device: torch.device
    ) -> LoraStep | None:
        """slots[i]: item i's slot (None: the base model), lengths[i]: its tokens, in the flat
        token order of the forward (items one after another). None when no item uses an adapter."""
        rows: dict[int, list[int]] = {}
        row_slots: list[int] = []
        start = 0
        for slot, n in zip(slots, lengths):
            if slot is not None:
                rows.setdefault(slot, []).extend(range(start, start + n))
            row_slots += [-1 if slot is None else slot] * n
            start += n
        if not rows:
            return None
        groups = [(s, torch.tensor(r, dtype=torch.long, device=device)) for s, r in rows.items()]
        return cls(pool, groups, row_slots)

    def layer(self, index: int) -> "LayerLora":
        return LayerLora(self, index)


class LayerLora:
    """The LoRA updates of one layer: __call__(target, x, out) adds them to out's rows in place."""

    def __init__(self, step: LoraStep, layer: int):
        self.step, self.index = step, layer

    def __call__(self, target: str, x: torch.Tensor, out: torch.Tensor) -> None:
        pool, step = self.step.pool, self.step
        if step.on_gpu:  # one launch pair for every row, each reading its own slot's weights
            from radixrt.kernels.lora_triton import lora_apply

            a, b = pool.a[target][self.index], pool.b[target][self.index]
            lora_apply(x.contiguous(), a, b, step.row_slots, step.scalings, out)
            return
        for slot, rows in self.step.groups:
            if (self.index, target) not in pool.present[slot]:
                continue
            r = pool.ranks[slot]
            a = pool.a[target][self.index, slot, :r]  # [r, in]
            b = pool.b[target][self.index, slot, :, :r]  # [out, r]
            xs = x.index_select(0, rows).to(a.dtype)
            delta = (xs @ a.T) @ b.T * pool.scalings[slot]
            out[rows] += delta.to(out.dtype)
