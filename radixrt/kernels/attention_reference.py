"""The per-request reference attention every backend is tested against: a loop, explicit GQA,
fp32."""

from __future__ import annotations

import torch

from radixrt.kernels.attention_batch import AttentionBatch


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    fb: AttentionBatch,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The simplest truth: a loop over requests, explicit GQA expansion, float32 softmax. window:
    sliding window attention, key j visible to query i when i - window < j <= i (transformers'
    rule). softcap: scores become tanh(s / cap) * cap (Gemma 2, as transformers computes it).

    q: [T, Hq, D]; k_cache/v_cache: [num_slots, Hkv, D] with this step's K/V already written.
    Returns [T, Hq, D] in q's dtype.
    """
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    qo_indptr = fb.qo_indptr.tolist()
    for b in range(fb.batch_size):
        seq_len, extend_len = fb.seq_lens_list[b], fb.extend_lens_list[b]
        prefix_len = seq_len - extend_len
        slots = fb.req_to_slot[int(fb.req_rows[b]), :seq_len]
        # [L, Hq, D]: q head h reads kv head h // group
        k = k_cache[slots].float().repeat_interleave(group, dim=1)
        v = v_cache[slots].float().repeat_interleave(group, dim=1)
        qb = q[qo_indptr[b] : qo_indptr[b + 1]].float()  # [E, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale  # [Hq, E, L]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(prefix_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        hidden = k_pos[None, None, :] > q_pos[None, :, None]
        if window is not None:
            hidden |= k_pos[None, None, :] <= q_pos[None, :, None] - window
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qo_indptr[b] : qo_indptr[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
