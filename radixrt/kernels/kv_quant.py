"""A quantised KV pool: int8 or fp8 (e4m3) values with one float32 scale per token per KV head.

Why per token per head: a token's K (or V) row for one head is written once, when the token is
computed, so its scale is known then and never changes; pages shared by the radix tree or by
parallel samples stay read-only. The scale is the row's absolute maximum over head_dim divided by
the format's largest value (127 for int8, 448 for e4m3), so every row uses its whole range; an
all-zero row gets scale 1.

`LayerKV` is one layer's K or V pool as the attention backends see it: the value tensor
[slots, Hkv, D] and, when quantised, its scales [slots, Hkv]; `write` quantises rows into slots,
`select` gathers slots back in a compute dtype. The Triton kernels read the same two tensors and
scale inside the kernel.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (values [..., D] in dtype, scales [...] float32) with x ~= values *
    scales[..., None]."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / QMAX[dtype], torch.ones_like(amax))
    scaled = xf / scale[..., None]
    if dtype == torch.int8:
        return scaled.round_().clamp_(-127, 127).to(torch.int8), scale
    return scaled.to(dtype), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (values.float() * scale[..., None]).to(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A one-byte-per-element tensor as uint8 (copies and gathers of fp8 are not implemented
    everywhere)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


class LayerKV:
    """One layer's K or V pool: values [slots, Hkv, D] and, when quantised, scales [slots, Hkv]
    float32."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None = None):
        self.values, self.scales = values, scales

    @property
    def quantized(self) -> bool:
        return self.scales is not None

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        if self.scales is None:
            self.values.index_copy_(0, slots, x)
            return
        q, s = quantize(x, self.values.dtype)
        _bytes(self.values).index_copy_(0, slots, _bytes(q))  # CPU torch has no fp8 index_copy
        self.scales.index_copy_(0, slots, s)

    def select(self, idx: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Rows idx into out (its dtype: the computation's)."""
        if self.scales is None:
            return torch.index_select(self.values, 0, idx, out=out)
        values = _bytes(self.values).index_select(0, idx).view(self.values.dtype).float()
        # scaled in float32
        return out.copy_(values.mul_(self.scales.index_select(0, idx)[..., None]))

    def rows(self, first: int, num: int, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous run of slots, in dtype."""
        if self.scales is None:
            return self.values[first : first + num].to(dtype)
        return dequantize(self.values[first : first + num], self.scales[first : first + num], dtype)
