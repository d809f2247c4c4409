"""An int8 copy of a weight, one scale per output channel, for the row counts where it is fastest.

At a handful of rows a step's matmuls stream the weights; at many they are bound by arithmetic.
int8 serves both: a quarter of float32's bytes (half of bf16's), and with dynamically quantised
activations an integer GEMM whose multiply-adds (VNNI's vpdpbusd, AVX2's vpmaddubsw) run at twice
bf16's rate or more. Which of these (or the exact 4-bit codes, or the plain float weight) a row
count takes is a measurement on the machine (weight_plan.py); both int8 kernels are torch's own:

  weight-only  torch._weight_int8pack_mm(x, q, scales): x in the model dtype, q dequantised in
               the kernel; y = (x q^T) * scale
  dynamic      each activation row quantised to int8 with its own scale (absmax / 127), then
               torch._int_mm(x_q, q^T) in int32 and y = acc * row_scale * scale

The per-channel scale is absmax / 127 of the channel's float32 values: a default model's Q4_1
weight has at most 16 levels per 32 values, so the int8 grid is at least as fine as the file's own
along most of a row (tests/integration/test_default_dtype_quality.py holds it to the floor).
"""

from __future__ import annotations

import torch


def available() -> bool:
    return hasattr(torch, "_weight_int8pack_mm") and hasattr(torch, "_int_mm")


class Int8Weight:
    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor):
        self.qweight = qweight  # [N, K] int8
        self.scales = scales  # [N] float32

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Weight | None:
        """weight [N, K] (float32 best: unrounded) -> its int8 form, or None off the CPU."""
        if not available() or weight.dim() != 2 or weight.device.type != "cpu":
            return None
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
        return cls(q, scales)

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32: the values this copy multiplies by (for tests and references)."""
        return self.qweight.float() * self.scales[:, None]


def matmul_weight_only(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """x [T, K] (bf16 or float32) times the int8 weight -> [T, N] in x's dtype."""
    return torch._weight_int8pack_mm(x.contiguous(), qweight, scales.to(x.dtype))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (int8 [T, K], float32 scale [T, 1]): symmetric, absmax / 127 per row."""
    xf = x.float()
    scale = (xf.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.round(xf / scale).clamp_(-127, 127).to(torch.int8), scale


def matmul_dynamic(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [T, K] quantised per row, times the int8 weight in int32 -> [T, N] in x's dtype."""
    xq, row_scale = quantize_rows(x)
    acc = torch._int_mm(xq, qweight.t())
    return (acc.float() * row_scale * scales).to(x.dtype)
