"""The online-softmax step both Triton attention kernels run over each block of keys."""
from __future__ import annotations

import triton
import triton.language as tl

# Finite "minus infinity" for running maxima: exp2(-inf - M_INIT) is 0, never NaN.
M_INIT = tl.constexpr(-1.0e30)


@triton.jit
def attend_block(q, k, v, visible, m_i, l_i, acc, sm_scale_log2,
                 DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):
    """Fold one K/V block into the running (max, sum, acc) of q's rows, in the log2 domain.
    q [M, D]; k, v [N, D]; visible broadcastable to [M, N]. Returns the new (m_i, l_i, acc)."""
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale_log2  # [M, N]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
