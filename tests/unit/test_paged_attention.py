"""The whole-step graph's decode attention over the paged pool (models/llama_step.paged_attention):
each request's query rows against the pool's slots at kv_idx where visible plus its newest key and
value (not in the pool yet), against a float64 softmax over an explicit gather, with the log-sum-exp
the cascade merges by; padding columns and slots outside kv_idx never count."""

from __future__ import annotations

import pytest
import torch

from radixrt.runtime.model.models.llama_layer import LayerDims
from radixrt.runtime.model.models.llama_step import paged_attention


def reference(q, k, v, k_pool, v_pool, kv_idx, own_lens, scale, hkv):
    """float64, one request and one q head at a time: its own slots' keys, then the newest."""
    b, hq, dim = q.shape
    out = torch.zeros(b, hq, dim, dtype=torch.float64)
    lse = torch.zeros(b, hq, dtype=torch.float64)
    for r in range(b):
        slots = kv_idx[r, : own_lens[r] - 1]
        for h in range(hq):
            g = h // (hq // hkv)  # the kv head this q head reads
            keys = torch.cat((k_pool[slots, g], k[r, g][None])).double()
            vals = torch.cat((v_pool[slots, g], v[r, g][None])).double()
            s = keys @ q[r, h].double() * scale
            out[r, h] = torch.softmax(s, 0) @ vals
            lse[r, h] = torch.logsumexp(s, 0)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_equals_a_float64_softmax_over_the_gathered_slots(dtype):
    torch.manual_seed(0)
    hq, hkv, dim, slots = 6, 2, 16, 300
    d = LayerDims(hq, hkv, dim, 32, 1e-5, dtype, torch.float32, dtype)
    for b, width in ((1, 2), (1, 37), (5, 64)):
        k_pool, v_pool = (
            torch.randn(slots, hkv, dim).to(dtype),
            torch.randn(slots, hkv, dim).to(dtype),
        )
        kv_idx = torch.stack([torch.randperm(slots)[:width] for _ in range(b)])
        own_lens = torch.randint(1, width + 1, (b,))
        own_lens[0] = 1  # a request whose only own token is the newest (the cascade's case)
        q = torch.randn(b, hq, dim).to(dtype)
        k, v = torch.randn(b, hkv, dim).to(dtype), torch.randn(b, hkv, dim).to(dtype)
        visible = torch.arange(width)[None, :] < own_lens[:, None] - 1
        scale = dim**-0.5
        out, lse = paged_attention(d, scale, q, k, v, k_pool, v_pool, kv_idx, visible)
        want, want_lse = reference(q, k, v, k_pool, v_pool, kv_idx, own_lens, scale, hkv)
        # float32 arithmetic on the inputs as given: float32 round-off only, whatever the dtype
        assert torch.allclose(out.reshape(b, hq, dim).double(), want, atol=1e-5, rtol=1e-5)
        assert torch.allclose(lse.reshape(b, hq).double(), want_lse, atol=1e-5, rtol=1e-5)
