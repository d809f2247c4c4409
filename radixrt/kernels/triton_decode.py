"""Split-KV decode attention over the paged KV pool (one query token per request).

Stage 1: program (request b, kv head, head block, split s) reads KV positions
`[s * chunk_len[b], min((s+1) * chunk_len[b], L_b))` of request b through the flat slot list
`kv_indices[kv_indptr[b]:kv_indptr[b+1]]` and writes, for each q head of its GQA group, the
chunk's normalised partial output and its log-sum-exp (base 2).
Stage 2: program (b, q head) merges the `num_splits[b]` partials by their log-sum-exps.

Splitting the KV axis is what keeps a small decode batch with long contexts from running on a
handful of SMs; the split counts are chosen on the host (see attention_triton.plan_decode_splits).
"""

from __future__ import annotations

import triton
import triton.language as tl

from radixrt.kernels.triton_softmax import M_INIT, attend_block, dequant_rows


@triton.jit
def _decode_stage1(
    Q,
    K_cache,
    V_cache,
    K_scale,
    V_scale,
    kv_indptr,
    kv_indices,
    num_splits,
    chunk_lens,
    Part_out,
    Part_lse,
    sm_scale_log2,
    cap_log2,
    window,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_scale,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if split >= tl.load(num_splits + b):
        return

    kv_start = tl.load(kv_indptr + b)
    seq_len = tl.load(kv_indptr + b + 1) - kv_start
    chunk_len = tl.load(chunk_lens + b)
    lo = split * chunk_len
    hi = tl.minimum(lo + chunk_len, seq_len)
    if window > 0:  # sliding window: only the last `window` positions (the query's own included)
        lo = tl.maximum(lo, seq_len - window)

    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q_heads = kv_head * GROUP + offs_g
    mask_h = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM

    q = tl.load(
        Q + b * stride_qt + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_H, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], M_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < hi
        slot = tl.load(kv_indices + kv_start + pos, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            K_cache + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        v = tl.load(
            V_cache + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        if QUANT:  # int8 / fp8 rows times their per-token, per-head scale
            k, v = dequant_rows(
                k, v, K_scale, V_scale, slot, kv_head, stride_scale, mask_n, q.dtype
            )
        m_i, l_i, acc = attend_block(
            q, k, v, mask_n[None, :], m_i, l_i, acc, sm_scale_log2, cap_log2, DOT_FP32, PRECISION
        )

    # A split is never empty (the host makes chunk_len * (num_splits - 1) < L), so l_i > 0, except
    # one wholly before a sliding window: it stores weight 0 (lse -inf), and the last split always
    # holds the query.
    seen = l_i > 0
    out_mask = mask_h[:, None] & mask_d[None, :]
    tl.store(
        Part_out
        + b * stride_pb
        + q_heads[:, None] * stride_ph
        + split * stride_ps
        + offs_d[None, :],
        acc / tl.where(seen, l_i, 1.0)[:, None],
        mask=out_mask,
    )
    tl.store(
        Part_lse + b * stride_lb + q_heads * stride_lh + split,
        tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf")),
        mask=mask_h,
    )


@triton.jit
def _decode_stage2(
    Part_out,
    Part_lse,
    num_splits,
    Out,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < tl.load(num_splits + b)
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        Part_lse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf")
    )
    # [BLOCK_S]; the last split holds the query itself: the max is finite
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(
        Part_out + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(
        Out + b * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=mask_d
    )
