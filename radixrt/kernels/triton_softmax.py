"""The steps both Triton attention kernels run over each block of keys: the online softmax, and
reading a quantised pool."""

from __future__ import annotations

import triton
import triton.language as tl

# Finite "minus infinity" for running maxima: exp2(-inf - M_INIT) is 0, never NaN.
M_INIT = tl.constexpr(-1.0e30)


@triton.jit
def attend_block(
    q,
    k,
    v,
    visible,
    m_i,
    l_i,
    acc,
    sm_scale_log2,
    cap_log2,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold one K/V block into the running (max, sum, acc) of q's rows, in the log2 domain.
    q [M, D]; k, v [N, D]; visible broadcastable to [M, N]. cap_log2 > 0: the scores soft-capped,
    cap * tanh(s / cap) (in the log2 domain as s is). Returns the new (m_i, l_i, acc)."""
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale_log2  # [M, N]
    if cap_log2 > 0.0:  # tanh(x) = 1 - 2 / (e^2x + 1): exact at both ends, no overflow to NaN
        s = cap_log2 * (1.0 - 2.0 / (tl.exp(2.0 * s / cap_log2) + 1.0))
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def dequant_rows(k, v, K_scale, V_scale, slot, kv_head, stride_scale, mask_n, dtype: tl.constexpr):
    """int8 / fp8 K and V rows [N, D] of a quantised pool -> dtype, times each row's scale
    (kv_quant.py): scales are [slots, Hkv] float32, one per token per KV head."""
    ks = tl.load(K_scale + slot * stride_scale + kv_head, mask=mask_n, other=0.0)
    vs = tl.load(V_scale + slot * stride_scale + kv_head, mask=mask_n, other=0.0)
    k = (k.to(tl.float32) * ks[:, None]).to(dtype)
    v = (v.to(tl.float32) * vs[:, None]).to(dtype)
    return k, v
