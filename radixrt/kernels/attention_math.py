"""The attention calls the torch backend (attention_torch.py) is built from, beside torch's own
SDPA and CPU flash kernel: the explicit float32 path (devices without the flash kernel, and
soft-capped scores, which SDPA cannot take), the causal mask it then needs, and the merge of two
partial softmaxes by their log-sum-exps (the cascade)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q, k, v, mask, scale: float, softcap: float | None, causal: bool = False):
    """Attention without the log-sum-exp: torch's SDPA, or the explicit path when soft-capped
    (SDPA has no softcap). causal: a fresh prompt's square causal mask instead of `mask`."""
    if softcap is None:
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    if causal:
        mask = causal_mask(q.shape[2], q.device)
    return attend_lse_matmul(q, k, v, mask, scale, softcap)[0]


def causal_mask(n: int, device) -> torch.Tensor:
    """[1, 1, n, n] additive: row i sees columns <= i."""
    return torch.full((n, n), float("-inf"), device=device).triu(1)[None, None]


def attend_lse_matmul(q, k, v, mask, scale, softcap=None):
    """_attend_lse with explicit matmuls in float32 (devices without the CPU flash kernel)."""
    b, num_q_heads, q_len, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_q_heads // num_kv_heads
    # the group's heads as extra rows
    qg = q.float().reshape(b, num_kv_heads, group * q_len, head_dim)
    scores = (qg @ k.float().transpose(-1, -2) * scale).view(b, num_kv_heads, group, q_len, -1)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask.float()[:, :, None]  # [B, 1, 1, Lq, Lk] over (Hkv, G)
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hkv, G, Lq]
    probs = torch.exp(scores - lse[..., None]).view(b, num_kv_heads, group * q_len, -1)
    out = (probs @ v.float()).view(b, num_q_heads, q_len, head_dim)
    return out.to(q.dtype), lse.view(b, num_q_heads, q_len)


def merge(
    out_own: torch.Tensor, lse_own: torch.Tensor, out_shared: torch.Tensor, lse_shared: torch.Tensor
) -> torch.Tensor:
    """Softmax attention over two disjoint key sets -> attention over their union, in float32.
    out [..., D], lse [...]; the result has out_own's dtype and (contiguous) layout."""
    # e^lse_shared / (e^lse_own + e^lse_shared), no overflow
    weight_shared = torch.sigmoid(lse_shared - lse_own)
    return torch.lerp(out_own.float(), out_shared.float(), weight_shared[..., None]).to(
        out_own.dtype
    )
