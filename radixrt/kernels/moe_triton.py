"""A mixture-of-experts feed-forward on a GPU (the fused-MoE scheme of SGLang and vLLM): the
(token, slot) pairs sorted by expert, each expert's run padded to whole blocks of BLOCK_M rows, so
that every block of rows belongs to one expert and one Triton launch multiplies all experts' rows
against their own weights.

    moe_align      the sort and the padding, in torch, without a host sync (sized to the bound)
    fused_experts  gate_up matmul -> silu(gate) * up (torch) -> down matmul times the routing
                   weight -> each token's sum over its k experts

Same result as the CPU path (runtime/model/models/moe_layer.py experts) up to float rounding;
tests/triton checks it there under the interpreter, tests/gpu compiled.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class MoeAlignment(NamedTuple):
    """sorted_ids [num_blocks * block_m] int32: pair indices (token * top_k + slot) grouped by
    expert, each expert's run padded with the sentinel num_pairs to a multiple of block_m.
    block_expert [num_blocks] int32: the expert of each block; -1 for the tail blocks past
    num_padded, which exist because the buffers are sized to the worst case, not the count.
    num_padded: 0-d int tensor, the padded rows actually used."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """ids [T, k] expert ids -> the pairs sorted by expert and padded per expert to block_m.

    Only tensor ops, no .item(): reading the counts back would stall the GPU once per layer, so
    the outputs take their worst-case size (every used expert wasting block_m - 1 rows)."""
    flat = ids.reshape(-1).long()
    num_pairs = flat.numel()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync for its length
    padded = (counts + block_m - 1) // block_m * block_m
    start = torch.cumsum(counts, 0) - counts
    padded_start = torch.cumsum(padded, 0) - padded
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    # the j-th sorted pair keeps its rank inside its expert's run, shifted to the padded start
    dest = padded_start[expert_of] + torch.arange(num_pairs, device=dev) - start[expert_of]
    max_padded = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    num_blocks = triton.cdiv(max_padded, block_m)
    sorted_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    # block b belongs to the first expert whose run of blocks ends after b
    block_end = torch.cumsum(padded // block_m, 0)
    blocks = torch.arange(num_blocks, device=dev)
    block_expert = torch.searchsorted(block_end, blocks, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return MoeAlignment(sorted_ids, block_expert, padded.sum())


@triton.jit
def _grouped_matmul(
    a_ptr, w_ptr, c_ptr, route_w_ptr, sorted_ids_ptr, block_expert_ptr, N, K, num_pairs,
    stride_am, stride_we, stride_wn, stride_cm,
    A_ROWS_PER: tl.constexpr, MUL_ROUTED: tl.constexpr, DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """c[pair, n-block] = a[pair // A_ROWS_PER] @ w[expert, n-block, :].T (* route_w[pair]) for
    the BLOCK_M sorted pairs of block program_id(0), all of one expert."""
    pid_m = tl.program_id(0)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # a tail block past the padded count: no rows
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    valid = pair < num_pairs  # the padding sentinel is num_pairs
    # matmul 1 reads token rows (a pair's token is pair // top_k); matmul 2 the pair's own row
    a_row = (pair // A_ROWS_PER).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]
    # w[expert] is [N, K] with K contiguous: read a [BLOCK_K, BLOCK_N] tile, i.e. transposed
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if DOT_FP32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if MUL_ROUTED:
        acc *= tl.load(route_w_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


def _block_sizes(num_pairs: int, num_experts: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K). BLOCK_M follows the rows an expert gets on average, so a decode
    step does not pad every expert's few rows to 64; 16 is tl.dot's least."""
    if _interpreting():
        return 16, 32, 32  # small tiles: short test shapes still cross tile borders
    block_m = min(64, max(16, triton.next_power_of_2(triton.cdiv(num_pairs, num_experts))))
    return block_m, 64, 64


def _launch(a, w, c, route_w, align, a_rows_per, blocks, num_pairs):
    block_m, block_n, block_k = blocks
    n, k = w.shape[1], w.shape[2]
    # the interpreter multiplies bf16 bit patterns in tl.dot (triton-lang/triton#11584): upcast
    dot_fp32 = _interpreting() and a.dtype == torch.bfloat16
    precision = "ieee" if a.dtype == torch.float32 else "tf32"  # fp32: exactness, not speed
    grid = (align.block_expert.numel(), triton.cdiv(n, block_n))
    _grouped_matmul[grid](
        a, w, c, route_w, align.sorted_ids, align.block_expert, n, k, num_pairs,
        a.stride(0), w.stride(0), w.stride(1), c.stride(0),
        A_ROWS_PER=a_rows_per, MUL_ROUTED=route_w is not None, DOT_FP32=dot_fp32,
        PRECISION=precision, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def fused_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    """The weighted sum of each token's chosen experts: [T, H] in x's dtype. x [T, H], weights and
    ids [T, k] (moe_layer.route's), gate_up [E, 2 I, H] (gate rows first), down [E, H, I]."""
    if x.device.type != "cuda" and not _interpreting():
        raise ValueError("fused_experts needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
    num_tokens, hidden = x.shape
    top_k = ids.shape[1]
    num_experts, inter = down.shape[0], down.shape[2]
    assert gate_up.shape == (num_experts, 2 * inter, hidden), gate_up.shape
    assert x.dtype == gate_up.dtype == down.dtype, (x.dtype, gate_up.dtype, down.dtype)
    assert x.stride(1) == 1 and gate_up.stride(2) == 1 and down.stride(2) == 1
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    blocks = _block_sizes(num_pairs, num_experts)
    align = moe_align(ids, num_experts, blocks[0])
    # the interpreter truncates float32 -> bf16 where a GPU rounds to nearest: it stores float32
    # and torch rounds, so that both match the CPU path's bf16 rows
    truncates = _interpreting() and x.dtype == torch.bfloat16
    gu = torch.empty(
        num_pairs, 2 * inter, dtype=torch.float32 if truncates else x.dtype, device=x.device
    )
    _launch(x, gate_up, gu, None, align, top_k, blocks, num_pairs)
    gu = gu.to(x.dtype)
    act = F.silu(gu[:, :inter]) * gu[:, inter:]  # contiguous [pairs, I]
    # float32 rows: the per-token sum below adds them unrounded
    out = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)
    route_w = weights.reshape(-1).contiguous()
    _launch(act, down, out, route_w, align, 1, blocks, num_pairs)
    return out.view(num_tokens, top_k, hidden).sum(1).to(x.dtype)
