"""The adapters a forward can use: --max-loras-per-batch slots of stacked LoRA weights, and one
forward's application of them (LoraStep).

Which adapter sits in which slot is the scheduler's decision (core/lora_slots.py: least recently
used among slots no running request holds); the plan names it per item (PlanItem.lora_slot /
lora) and the runner copies an adapter in when its slot held another (lora_registry.py).

Weights are stacked per group of targets that read the same input (q/k/v, o, gate/up, down), every
slot's rank padded to --max-lora-rank with zeros: A [n*S*R, in] (target i, slot s, rank r in rows
i*S*R + s*R + r) and B [out, n*S*R] block diagonal (target i's rows, target i's columns). On a CPU
one forward's update of a group is then three ops whatever the mix of adapters in the batch: the
shrink x @ A^T for every slot at once, a per-row scale that keeps only the row's own slot's columns
(times its scaling; zero for the base model's rows), and the expand into the group's fused output:
the grouped (segmented) GEMM without a per-adapter loop, at the price of a shrink over every slot,
tiny next to the base projection (rank columns, not output columns). On a GPU the Triton kernels
(kernels/lora_triton.py) read each row's own slot instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from radixrt.runtime.model.lora_adapter import LoraAdapter, TargetDims

# targets that read the same input, in the order of the fused projection's output columns
GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


@dataclass
class GroupWeights:
    targets: tuple[str, ...]
    a: torch.Tensor  # [L, n*S*R, in]
    b: torch.Tensor  # [L, out, n*S*R], target i's block at rows offsets[i], columns i*S*R
    offsets: list[int]  # each target's first output column
    widths: list[int]  # each target's output columns


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
        self.num_slots, self.max_rank = S, R
        self.groups: dict[str, GroupWeights] = {}
        for name, targets in GROUPS.items():
            fan_in = dims.dims[targets[0]][0]
            widths = [dims.dims[t][1] for t in targets]
            offsets = [sum(widths[:i]) for i in range(len(widths))]
            n = len(targets)
            a = torch.zeros(L, n * S * R, fan_in, dtype=dtype, device=device)
            b = torch.zeros(L, sum(widths), n * S * R, dtype=dtype, device=device)
            self.groups[name] = GroupWeights(targets, a, b, offsets, widths)
        self.where = {t: (g, i) for g, gw in self.groups.items() for i, t in enumerate(gw.targets)}
        self.names: list[str | None] = [None] * S
        self.scalings = [0.0] * S

    def _columns(self, index: int, slot: int) -> slice:
        """Target index's rank columns of slot, inside its group."""
        start = (index * self.num_slots + slot) * self.max_rank
        return slice(start, start + self.max_rank)

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy adapter into slot (what was there is overwritten)."""
        for gw in self.groups.values():
            for i in range(len(gw.targets)):
                gw.a[:, self._columns(i, slot)].zero_()
                gw.b[:, :, self._columns(i, slot)].zero_()
        for (layer, target), (a, b) in adapter.weights.items():
            group, i = self.where[target]
            gw = self.groups[group]
            cols, r = self._columns(i, slot), a.shape[0]
            rows = slice(gw.offsets[i], gw.offsets[i] + gw.widths[i])
            gw.a[layer, cols.start : cols.start + r].copy_(a)
            gw.b[layer, rows, cols.start : cols.start + r].copy_(b)
        self.names[slot], self.scalings[slot] = adapter.name, adapter.scaling

    def clear(self, name: str) -> None:
        """An unloaded adapter leaves its slot (the slot's weights stay until overwritten)."""
        for slot, held in enumerate(self.names):
            if held == name:
                self.names[slot] = None


class LoraStep:
    """One forward's LoRA rows: each token row's slot (-1: the base model)."""

    def __init__(self, pool: LoraPool, row_slots: list[int], device: torch.device):
        self.pool = pool
        self.on_gpu = device.type == "cuda"
        # the kernels' view: every row's slot (-1: none) and the slots' scalings
        self.row_slots = torch.tensor(row_slots, dtype=torch.int32, device=device)
        self.scalings = torch.tensor(pool.scalings, dtype=torch.float32, device=device)
        self._tiled: dict[int, torch.Tensor] = {}

    @functools.cached_property
    def row_scale(self) -> torch.Tensor:
        """The CPU path's [T, S*R]: each row's slot's scaling on that slot's rank columns, zero
        elsewhere (and for the base model's rows)."""
        S, R = self.pool.num_slots, self.pool.max_rank
        slots = self.row_slots.long()
        own = torch.arange(S, device=slots.device)[None, :] == slots[:, None]  # [T, S]
        scale = own * self.scalings[None, :]
        dtype = self.pool.groups["o"].a.dtype
        return scale[:, :, None].expand(-1, S, R).reshape(len(slots), S * R).to(dtype)

    @classmethod
    def for_items(
        cls, pool: LoraPool, slots: list[int | None], lengths: list[int], device: torch.device
    ) -> LoraStep | None:
        """slots[i]: item i's slot (None: the base model), lengths[i]: its tokens, in the flat
        token order of the forward (items one after another). None when no item uses an adapter."""
        if all(s is None for s in slots):
            return None
        row_slots = [-1 if s is None else s for s, n in zip(slots, lengths) for _ in range(n)]
        return cls(pool, row_slots, device)

    def scale(self, n: int) -> torch.Tensor:
        """row_scale repeated for a group of n targets: [T, n*S*R]."""
        if n not in self._tiled:
            self._tiled[n] = self.row_scale.repeat(1, n)
        return self._tiled[n]

    def layer(self, index: int) -> "LayerLora":
        return LayerLora(self, index)


class LayerLora:
    """The LoRA updates of one layer: __call__(group, x, out) adds them to the group's fused output
    out ([T, sum of its targets' widths]) in place."""

    def __init__(self, step: LoraStep, layer: int):
        self.step, self.index = step, layer

    def __call__(self, group: str, x: torch.Tensor, out: torch.Tensor) -> None:
        gw = self.step.pool.groups[group]
        if self.step.on_gpu:
            self._gpu(gw, x, out)
            return
        a, b = gw.a[self.index], gw.b[self.index]
        tmp = (x.to(a.dtype) @ a.T) * self.step.scale(len(gw.targets))
        out += (tmp @ b.T).to(out.dtype)

    def _gpu(self, gw: GroupWeights, x: torch.Tensor, out: torch.Tensor) -> None:
        """Per target of the group: the Triton kernels, every row reading its own slot."""
        from radixrt.kernels.lora_triton import lora_apply

        pool, step = self.step.pool, self.step
        S, R = pool.num_slots, pool.max_rank
        x = x.contiguous()
        for i, (off, width) in enumerate(zip(gw.offsets, gw.widths)):
            cols = slice(i * S * R, (i + 1) * S * R)
            a = gw.a[self.index, cols].view(S, R, -1)
            b = gw.b[self.index, off : off + width, cols].view(width, S, R).permute(1, 0, 2)
            lora_apply(x, a, b, step.row_slots, step.scalings, out[:, off : off + width])
