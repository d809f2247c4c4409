"""LoRA's update on a GPU: out[t] += scaling[s] * B[s] @ (A[s] @ x[t]) for each token row t whose
adapter slot s = row_slots[t] (-1: the base model, nothing added), in two Triton kernels (SGLang's
and Punica's shrink / expand): every row reads its own slot's weights, so one launch serves a batch
mixing adapters without merging weights. The CPU path (runtime/model/lora_pool.py) groups rows by
slot and multiplies with torch; tests/triton checks this one against it under the interpreter."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink(
    x_ptr, a_ptr, slot_ptr, tmp_ptr, IN, R, stride_xt, stride_as, stride_ar, stride_tt,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """tmp[t, :R] = A[slot] @ x[t] (float32)."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        r = tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for k0 in range(0, IN, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + t * stride_xt + k, mask=k < IN, other=0.0).to(tl.float32)
            a_rows = a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :]
            av = tl.load(a_rows, mask=(r[:, None] < R) & (k[None, :] < IN), other=0.0)
            acc += tl.sum(av.to(tl.float32) * xv[None, :], axis=1)
        tl.store(tmp_ptr + t * stride_tt + r, acc, mask=r < R)


@triton.jit
def _expand(
    tmp_ptr, b_ptr, slot_ptr, scale_ptr, out_ptr, OUT, R, stride_tt, stride_bs, stride_bo,
    stride_ot, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """out[t, o-block] += scaling[slot] * B[slot, o-block] @ tmp[t]."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        r = tl.arange(0, BLOCK_R)
        tv = tl.load(tmp_ptr + t * stride_tt + r, mask=r < R, other=0.0)
        b_rows = b_ptr + slot * stride_bs + o[:, None] * stride_bo + r[None, :]
        bv = tl.load(b_rows, mask=(o[:, None] < OUT) & (r[None, :] < R), other=0.0)
        delta = tl.sum(bv.to(tl.float32) * tv[None, :], axis=1) * tl.load(scale_ptr + slot)
        prev = tl.load(out_ptr + t * stride_ot + o, mask=o < OUT, other=0.0)
        new = prev.to(tl.float32) + delta
        tl.store(out_ptr + t * stride_ot + o, new.to(prev.dtype), mask=o < OUT)


def lora_apply(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    row_slots: torch.Tensor,
    scalings: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Add every row's adapter update to out in place. x [T, IN] (rows contiguous), a [S, R, IN],
    b [S, OUT, R] (a slot's unused rank columns are zero), row_slots [T] int32 (-1: none),
    scalings [S] float32, out [T, OUT] with contiguous rows (a column slice of a fused output
    is fine); b's rank columns contiguous (a view into a stacked block is fine)."""
    num_tokens, fan_in = x.shape
    rank, fan_out = a.shape[1], b.shape[1]
    assert x.stride(1) == 1 and out.stride(1) == 1 and a.is_contiguous() and b.stride(2) == 1
    tmp = torch.empty(num_tokens, rank, dtype=torch.float32, device=x.device)
    block_r = triton.next_power_of_2(rank)
    _shrink[(num_tokens,)](
        x, a, row_slots, tmp, fan_in, rank, x.stride(0), a.stride(0), a.stride(1), tmp.stride(0),
        BLOCK_R=block_r, BLOCK_K=64,
    )  # fmt: skip
    block_o = 64
    _expand[(num_tokens, triton.cdiv(fan_out, block_o))](
        tmp, b, row_slots, scalings, out, fan_out, rank, tmp.stride(0), b.stride(0), b.stride(1),
        out.stride(0), BLOCK_O=block_o, BLOCK_R=block_r,
    )  # fmt: skip
