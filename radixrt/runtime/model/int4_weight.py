"""A 4-bit copy of a weight that is exactly 4-bit already, for steps of a few rows on a CPU.

The default model ships as a Q4_1 GGUF: every row of its layer weights is made of groups of 32
values `q * d + m` with q in 0..15 (the converted checkpoint holds them dequantized). At one to a
few rows a decode step's matmuls are bound by streaming the weights from memory, so reading those
groups as 4-bit codes instead of bf16 values reads a quarter of the bytes: on a 2-core Xeon the
matmuls of a one-row step take 4 ms instead of 13 (benchmarks/bench_vs_vllm.py, batch-1). torch's
CPU int4 kernel computes `(q - 8) * scale + zero` per group, so scale = d and zero = m + 8 d, both
in bf16 (the zero refitted to the rounded scale). At more rows the kernel's dequantization costs
more than the bytes it saves, so Linear uses this copy only up to MAX_ROWS rows.

A weight that is not exactly 4-bit groups (another checkpoint, a trained fp32 model) gets no copy.
"""

from __future__ import annotations

import torch

GROUP = 32
# int4 beats the bf16 GEMM up to here (one step's matmuls: 4.0 / 5.1 / 7.2 ms at 1 / 2 / 4 rows vs
# ~13 ms bf16; 4x slower than bf16 at 16 rows in cache)
MAX_ROWS = 4


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
        low = groups.amin(-1, keepdim=True)
        step = (groups.amax(-1, keepdim=True) - low) / 15
        safe = torch.where(step > 0, step, torch.ones_like(step))
        codes = torch.round((groups - low) / safe).clamp_(0, 15)
        rebuilt = codes * step + low
        if not torch.allclose(
            rebuilt, groups, rtol=0, atol=1e-6 * float(groups.abs().max().clamp_min(1e-30))
        ):
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


def matmul(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """x [T, K] bf16 times a 4-bit weight's packed codes and [K / GROUP, N, 2] scales -> [T, N]
    bf16."""
    return torch._weight_int4pack_mm_for_cpu(x.contiguous(), packed, GROUP, scales_and_zeros)
