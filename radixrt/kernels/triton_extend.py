"""Extend attention: a request's new tokens attend to its cached prefix, then causally to
themselves.

Program (extend request e, q head h, query tile m) loads BLOCK_M query rows of request e and
runs one online softmax over two key ranges:
  1. the cached prefix, positions `0 .. prefix_len-1`, gathered from the pool through the flat
     slot list `prefix_indices[prefix_indptr[e]:prefix_indptr[e+1]]` (no mask: all are visible);
  2. the new tokens themselves, read straight from the contiguous new K/V rows
     `qo_indptr[e] ..` with the causal mask (new key j visible to new query i iff j <= i).
Requests of any lengths share one launch: the grid's tile axis covers the longest extend and
tiles past a request's end exit at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from radixrt.kernels.triton_softmax import M_INIT, attend_block, dequant_rows


@triton.jit
def _extend_kernel(
    Q,
    K_new,
    V_new,
    K_cache,
    V_cache,
    K_scale,
    V_scale,
    Out,
    qo_indptr,
    prefix_indptr,
    prefix_indices,
    sm_scale_log2,
    cap_log2,
    window,
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_scale,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
):
    e = tl.program_id(0)
    h = tl.program_id(1)
    tile = tl.program_id(2)
    qo_start = tl.load(qo_indptr + e)
    extend_len = tl.load(qo_indptr + e + 1) - qo_start
    if tile * BLOCK_M >= extend_len:
        return
    kv_head = h // GROUP
    prefix_start = tl.load(prefix_indptr + e)
    prefix_len = tl.load(prefix_indptr + e + 1) - prefix_start

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM
    rows = (qo_start + offs_m).to(tl.int64)
    q = tl.load(
        Q + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # 1. cached prefix: every position is visible to every new query
    for start in range(0, prefix_len, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < prefix_len
        slot = tl.load(prefix_indices + prefix_start + pos, mask=mask_n, other=0).to(tl.int64)
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
        # [BLOCK_M, BLOCK_N]: every prefix key, unless a sliding window hides it: key pos is visible
        # to query prefix_len + m iff pos > prefix_len + m - window
        visible = mask_n[None, :] & (offs_m[:, None] >= 0)
        if window > 0:
            visible = visible & (pos[None, :] > prefix_len + offs_m[:, None] - window)
        m_i, l_i, acc = attend_block(
            q, k, v, visible, m_i, l_i, acc, sm_scale_log2, cap_log2, DOT_FP32, PRECISION
        )

    # 2. new tokens, causal; keys past this tile's last query are never visible
    causal_end = tl.minimum(extend_len, (tile + 1) * BLOCK_M)
    for start in range(0, causal_end, BLOCK_N):
        pos = start + offs_n
        mask_n = pos < causal_end
        key_rows = (qo_start + pos).to(tl.int64)
        k = tl.load(
            K_new + key_rows[:, None] * stride_knt + kv_head * stride_knh + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        v = tl.load(
            V_new + key_rows[:, None] * stride_vnt + kv_head * stride_vnh + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        visible = mask_n[None, :] & (pos[None, :] <= offs_m[:, None])
        if window > 0:
            visible = visible & (pos[None, :] > offs_m[:, None] - window)
        m_i, l_i, acc = attend_block(
            q, k, v, visible, m_i, l_i, acc, sm_scale_log2, cap_log2, DOT_FP32, PRECISION
        )

    # every valid query row sees at least itself, so l_i > 0 where stored
    out = acc / tl.where(mask_m, l_i, 1.0)[:, None]
    tl.store(
        Out + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )
