"""A 4-bit copy of a weight that is exactly 4-bit already, for steps of a few rows on a CPU.

The default model ships as a Q4_1 GGUF: every row of its layer weights is made of groups of 32
values `q * d + m` with q in 0..15 (the converted checkpoint holds them dequantized). At one to a
few rows a decode step's matmuls are bound by streaming the weights from memory, so reading those
groups as 4-bit codes instead of bf16 values reads a quarter of the bytes: on a 2-core Xeon the
matmuls of a one-row step take 4 ms instead of 13 (benchmarks/bench_vs_vllm.py, batch-1). torch's
CPU int4 kernel computes `(q - 8) * scale + zero` per group, so scale = d and zero = m + 8 d, both
in bf16 (the zero refitted to the rounded scale). At more rows the kernel's dequantization costs
more than the bytes it saves: which row counts read this copy is weight_plan.py's measurement.

Q4_0's groups ((q - 8) d) and Q4_K's 32-wide sub-blocks (d sc q - dmin m) are 4-bit grids too,
though a group need not use its lowest or highest code: a group qualifies when its values lie on
one arithmetic grid of at most 16 levels, whatever codes it uses. A weight that is not exactly
4-bit groups (Q5/Q6/Q8 files, another checkpoint, a trained fp32 model) gets no copy.
"""

from __future__ import annotations

import torch

GROUP = 32


def available() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch, "_convert_weight_to_int4pack_for_cpu"
    )


class Int4Weight:
    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor):
        self.packed = packed
        self.scales_and_zeros = scales_and_zeros  # [K / GROUP, N, 2] bf16

    @classmethod
    def from_exact(cls, weight: torch.Tensor) -> Int4Weight | None:
        """weight [N, K] float32 (before any rounding) -> its 4-bit form, or None when some group of
        GROUP values along K is not {q * d + m : q in 0..15} (checked by rebuilding every value)."""
        if (
            not available()
            or weight.dim() != 2
            or weight.device.type != "cpu"
            or weight.shape[1] % GROUP
        ):
            return None
        n, k = weight.shape
        groups = weight.float().reshape(n, k // GROUP, GROUP)
        codes, step = _grid_codes(groups)
        if codes is None:
            return None
        packed = torch._convert_weight_to_int4pack_for_cpu(codes.reshape(n, k).to(torch.int32), 1)
        # the kernel takes bf16 scales: round the scale, then fit the zero to the rounded scale (the
        # group's mean residual), which takes back part of the scale's rounding
        scale = step.to(torch.bfloat16).float()
        zero = (groups - (codes - 8) * scale).mean(-1, keepdim=True)
        scale, zero = scale[..., 0], zero[..., 0]  # [N, K / GROUP]
        scales_and_zeros = (
            torch.stack((scale.t(), zero.t()), dim=-1).to(torch.bfloat16).contiguous()
        )
        return cls(packed, scales_and_zeros)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] bf16 -> [T, N] bf16."""
        return matmul(x, self.packed, self.scales_and_zeros)


def _grid_codes(groups: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Every group [..., GROUP] as codes 0..15 times one step above the group's minimum, or None
    when some group is not such a grid (checked by rebuilding every value). The step tried first is
    the group's span / 15 (a group using its lowest and highest codes: all of Q4_1's), then the
    smallest gap between its values and 1/2 .. 1/15 of it; each candidate is tried only on the
    groups the ones before it did not fit. Only the groups the first step misses are sorted (to
    refuse a float weight, more than 16 distinct values in a group, in one pass): a Q4_1 weight
    is read without a sort (sorting every group was ~70% of loading the default model's copies).
    """
    flat = groups.reshape(-1, GROUP)
    low, high = flat.aminmax(dim=-1)
    tol = 1e-6 * float(torch.maximum(low.abs(), high.abs()).max().clamp_min(1e-30))
    offsets = flat - low[:, None]
    step, codes = torch.zeros_like(low), torch.zeros_like(flat)
    todo = _fit(offsets, (high - low) / 15, None, step, codes, tol)
    if todo.numel():
        # at most 16 distinct values per group, or no grid
        ordered = flat[todo].sort(-1).values
        if bool(((ordered.diff(dim=-1) > tol).sum(-1) > 15).any()):
            return None, groups.new_zeros(())
        # the smallest offset above tol in each group (a constant group: step 1, all codes 0)
        rest = offsets[todo]
        gap = torch.where(rest > tol, rest, torch.full_like(rest, float("inf"))).amin(-1)
        gap = torch.where(torch.isfinite(gap), gap, torch.ones_like(gap))
        gap_of = torch.zeros_like(low)
        gap_of[todo] = gap
        for parts in range(1, 16):
            todo = _fit(offsets, gap_of / parts, todo, step, codes, tol)
            if todo.numel() == 0:
                break
    if todo.numel():
        return None, step
    return codes.reshape(groups.shape), step.reshape(*groups.shape[:-1], 1)


def _fit(
    offsets: torch.Tensor,
    steps: torch.Tensor,
    todo: torch.Tensor | None,
    step: torch.Tensor,
    codes: torch.Tensor,
    tol: float,
) -> torch.Tensor:
    """Try steps[g] on each group g of todo (None: every group, without copying them): where every
    offset is a code 0..15 times it (within tol), write step and codes. -> the groups left."""
    if todo is None:
        todo, s, o = torch.arange(offsets.shape[0]), steps[:, None], offsets
    else:
        s, o = steps[todo][:, None], offsets[todo]
    s = torch.where(s > 0, s, torch.ones_like(s))
    c = torch.round(o / s)
    fits = ((c * s - o).abs() <= tol).all(-1) & (c.amax(-1) <= 15)
    if bool(fits.all()):
        step[todo], codes[todo] = s[:, 0], c
        return todo[:0]
    done = todo[fits]
    step[done], codes[done] = s[fits, 0], c[fits]
    return todo[~fits]


def matmul(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """x [T, K] bf16 times a 4-bit weight's packed codes and [K / GROUP, N, 2] scales -> [T, N]
    bf16."""
    return torch._weight_int4pack_mm_for_cpu(x.contiguous(), packed, GROUP, scales_and_zeros)
