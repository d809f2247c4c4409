"""Paged attention inputs for the Triton kernel tests (interpreted on the CPU in tests/triton,
compiled on a GPU in tests/gpu), and the check of a backend against reference_attention.

Pages are drawn from a shuffled pool, so slots are scattered; q, k, v are views of one fused
projection, like the model's qkv split (non-contiguous rows).
"""

from __future__ import annotations

import random

import torch

from radixrt.kernels.attention_reference import reference_attention
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.forward_batch import build_forward_batch


def make_case(
    prefix_lens,
    extend_lens,
    num_q_heads,
    num_kv_heads,
    head_dim,
    page_size,
    dtype,
    seed=0,
    device="cpu",
    share_prefix=False,
):
    """Requests (prefix_len, extend_len), decode ones (1 new token) first. share_prefix: later requests
    read request 0's whole prefix pages, as requests borrowing one radix-cache prefix do.
    Returns (fb, q, k, v, k_cache, v_cache)."""
    gen = random.Random(seed)
    torch.manual_seed(seed)
    pages_needed = [-(-(p + e) // page_size) for p, e in zip(prefix_lens, extend_lens)]
    num_pages = sum(pages_needed) + 3
    free = list(range(num_pages))
    gen.shuffle(free)
    max_context = max(p + e for p, e in zip(prefix_lens, extend_lens))
    req_to_slot = torch.zeros((len(prefix_lens) + 2, max_context), dtype=torch.int64, device=device)
    items, page_lists = [], []
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        pages = [free.pop() for _ in range(pages_needed[i])]
        if share_prefix and i > 0 and p >= page_size:
            num_shared = min(p, prefix_lens[0]) // page_size
            pages[:num_shared] = page_lists[0][:num_shared]
        page_lists.append(pages)
        slots = [pages[j // page_size] * page_size + j % page_size for j in range(p + e)]
        items.append(
            PlanItem(
                row=i + 1,
                new_ids=[gen.randrange(100) for _ in range(e)],
                computed_len=p,
                slots=slots,
                write_start=0,
            )
        )
    fb = build_forward_batch(items, req_to_slot, device=device)
    num_slots = num_pages * page_size
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, device=device).to(dtype)
    v_cache = torch.randn(num_slots, num_kv_heads, head_dim, device=device).to(dtype)
    qkv = torch.randn(fb.num_tokens, num_q_heads + 2 * num_kv_heads, head_dim, device=device).to(
        dtype
    )
    q, k, v = qkv.split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    return fb, q, k, v, k_cache, v_cache


def check_against_reference(
    backend, case, atol: float, rtol: float, window: int | None = None, softcap=None
) -> None:
    """Run one forward of `backend` on a make_case case: the new K/V must land at out_slots and the
    output must match reference_attention on the cache updated here (window: a sliding-window layer)."""
    fb, q, k, v, k_cache, v_cache = case
    scale = q.shape[-1] ** -0.5
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[fb.out_slots] = k
    want_v[fb.out_slots] = v
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, k_cache, v_cache, fb, scale, window=window, softcap=softcap)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), (
        "new K/V not stored at out_slots"
    )
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out.float()).all()
    expected = reference_attention(q, want_k, want_v, fb, scale, window=window, softcap=softcap)
    torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol)
