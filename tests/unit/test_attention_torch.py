"""TorchAttentionBackend (padded, batched) against reference_attention (per-request loop)."""
from __future__ import annotations

import random
import zlib

import pytest
import torch

from radixrt.kernels.attention_torch import TorchAttentionBackend, reference_attention
from radixrt.runtime.forward_batch import BatchItem, build_forward_batch
from radixrt.runtime.page_pool import slots_of

HEAD_DIM = 16
NUM_KV_HEADS = 2


def make_batch(rng: random.Random, decode_lens: list[int], extends: list[tuple[int, int]], page_size: int,
               max_rows: int = 16, max_context: int = 512):
    """decode_lens: KV length before each decode step; extends: (prefix_len, extend_len) per request.

    Every request gets pages drawn at random from a shuffled pool, so its slots are scattered.
    Returns (fb, num_slots). The table starts filled with junk (stale) slots to catch reads past seq_len.
    """
    specs = [(n, 1) for n in decode_lens] + list(extends)
    num_pages = sum(-(-(p + e) // page_size) for p, e in specs) + 3
    free_pages = list(range(num_pages))
    rng.shuffle(free_pages)
    num_slots = num_pages * page_size
    table = torch.randint(0, num_slots, (max_rows, max_context), dtype=torch.int64)
    rows = rng.sample(range(max_rows), len(specs))
    items = []
    for row, (prefix_len, extend_len) in zip(rows, specs):
        seq_len = prefix_len + extend_len
        pages = [free_pages.pop() for _ in range(-(-seq_len // page_size))]
        # the prefix part of the table was written by earlier steps; this step writes from a random point
        write_start = rng.randint(0, prefix_len)
        table[row, :write_start] = torch.tensor(slots_of(pages, 0, write_start, page_size), dtype=torch.int64)
        items.append(BatchItem(row=row, new_ids=[rng.randrange(100) for _ in range(extend_len)],
                               prefix_len=prefix_len, slots=slots_of(pages, write_start, seq_len, page_size),
                               write_start=write_start))
    fb = build_forward_batch(items, table)
    assert fb.num_decode == len(decode_lens)
    return fb, num_slots


def run_both(fb, num_slots: int, num_q_heads: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = fb.num_tokens
    q = torch.randn(T, num_q_heads, HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(T, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(T, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    k_cache = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ref_k[fb.out_slots] = k
    ref_v[fb.out_slots] = v
    scale = HEAD_DIM ** -0.5
    expected = reference_attention(q, ref_k, ref_v, fb, scale)

    backend = TorchAttentionBackend(num_q_heads, NUM_KV_HEADS, HEAD_DIM)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, k_cache, v_cache, fb, scale)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v), "new K/V not written at out_slots"
    # a second layer reuses the same metadata (and its gather workspaces)
    out2 = backend.forward(q, k, v, k_cache, v_cache, fb, scale)
    assert out.shape == (T, num_q_heads, HEAD_DIM)
    return out, out2, expected


SCENARIOS = {
    "decode_only": ([5, 17, 1, 40], []),
    "one_decode": ([33], []),
    "decode_equal_lens": ([9, 9, 9], []),
    "fresh_prompt": ([], [(0, 23)]),
    "single_token_prompt": ([], [(0, 1)]),
    "extend_cached_prefix": ([], [(19, 7)]),
    "fresh_prompts_mixed_lens": ([], [(0, 1), (0, 37), (0, 4)]),
    "extends_with_prefixes": ([], [(0, 5), (30, 3), (12, 1), (0, 1)]),
    "mixed": ([3, 50, 1], [(0, 11), (20, 9), (64, 1)]),
    "very_different_lengths": ([200, 2], [(0, 150), (0, 1), (7, 2)]),
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_backend_matches_reference(scenario, group, page_size):
    decode_lens, extends = SCENARIOS[scenario]
    rng = random.Random(zlib.crc32(f"{scenario}/{group}/{page_size}".encode()))
    fb, num_slots = make_batch(rng, decode_lens, extends, page_size)
    out, out2, expected = run_both(fb, num_slots, group * NUM_KV_HEADS, seed=rng.randrange(1000))
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out2, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_random_batches(seed):
    rng = random.Random(seed)
    page_size = rng.choice([1, 2, 16])
    decode_lens = [rng.randint(1, 90) for _ in range(rng.randint(0, 5))]
    extends = [(rng.choice([0, rng.randint(0, 60)]), rng.randint(1, 40)) for _ in range(rng.randint(0, 4))]
    if not decode_lens and not extends:
        extends = [(0, 3)]
    fb, num_slots = make_batch(rng, decode_lens, extends, page_size)
    out, _, expected = run_both(fb, num_slots, rng.choice([1, 3, 4]) * NUM_KV_HEADS, seed=seed)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_bfloat16_close_to_reference():
    rng = random.Random(7)
    fb, num_slots = make_batch(rng, [12, 30], [(0, 9), (5, 4)], page_size=16)
    out, _, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_reference_is_causal_softmax():
    """The reference itself against a hand computation: one request, one head, 2 cached + 2 new tokens."""
    table = torch.zeros((1, 8), dtype=torch.int64)
    fb = build_forward_batch([BatchItem(row=0, new_ids=[1, 2], prefix_len=2, slots=[3, 1, 0, 2], write_start=0)],
                             table)
    k_cache = torch.randn(4, 1, 2)
    v_cache = torch.randn(4, 1, 2)
    q = torch.randn(2, 1, 2)
    out = reference_attention(q, k_cache, v_cache, fb, scale=0.5)
    order = torch.tensor([3, 1, 0, 2])  # slots of positions 0..3
    for i, visible in enumerate((3, 4)):  # token at position 2 sees 0..2, position 3 sees 0..3
        keys, values = k_cache[order[:visible], 0], v_cache[order[:visible], 0]
        weights = torch.softmax(keys @ q[i, 0] * 0.5, dim=0)
        torch.testing.assert_close(out[i, 0], weights @ values)
