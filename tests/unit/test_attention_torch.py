"""TorchAttentionBackend (padded, batched) against reference_attention (per-request loop)."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from radixrt.kernels import attention_torch
from radixrt.kernels.attention_math import attend_lse_matmul
from radixrt.kernels.attention_reference import reference_attention
from radixrt.kernels.attention_torch import (
    CASCADE_MIN_SHARED_LEN,
    TorchAttentionBackend,
    _attend_lse,
)
from radixrt.runtime.core.page_allocator import slots_of
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.forward_batch import build_forward_batch

HEAD_DIM = 16
NUM_KV_HEADS = 2


def make_batch(
    rng: random.Random,
    decode_lens: list[int],
    extends: list[tuple[int, int]],
    page_size: int,
    max_rows: int = 16,
    max_context: int = 512,
    shared_lens: list[int] | None = None,
    consecutive_shared: bool = False,
):
    """decode_lens: KV length before each decode step; extends: (prefix_len, extend_len) per request.
    shared_lens: per request (decode first), how many leading positions use one common run of pages, as
    when requests borrow the same radix-cache prefix; the rest of a request's positions use its own pages.

    Pages are drawn at random from a shuffled pool, so slots are scattered; consecutive_shared puts the
    common run in consecutive slots (a prefix prefilled in one go), which the backend reads in place.
    Returns (fb, num_slots). The table starts filled with junk (stale) slots to catch reads past seq_len.
    """
    specs = [(n, 1) for n in decode_lens] + list(extends)
    shared_lens = shared_lens or [0] * len(specs)
    assert len(shared_lens) == len(specs)
    pages_of = lambda n: -(-n // page_size)  # noqa: E731
    num_pages = (
        sum(pages_of(p + e - sh) for (p, e), sh in zip(specs, shared_lens))
        + pages_of(max(shared_lens))
        + 3
    )
    free_pages = list(range(num_pages))
    rng.shuffle(free_pages)
    num_slots = num_pages * page_size
    common_pages = [free_pages.pop() for _ in range(pages_of(max(shared_lens)))]
    if consecutive_shared:
        first = rng.randrange(num_pages - len(common_pages) + 1)
        common_pages = list(range(first, first + len(common_pages)))
        free_pages = [pg for pg in range(num_pages) if pg not in common_pages]
        rng.shuffle(free_pages)
    common = slots_of(common_pages, 0, max(shared_lens), page_size)
    table = torch.randint(0, num_slots, (max_rows, max_context), dtype=torch.int64)
    rows = rng.sample(range(max_rows), len(specs))
    items = []
    for row, (prefix_len, extend_len), shared_len in zip(rows, specs, shared_lens):
        seq_len = prefix_len + extend_len
        assert shared_len <= seq_len
        pages = [free_pages.pop() for _ in range(pages_of(seq_len - shared_len))]
        slots = common[:shared_len] + slots_of(pages, 0, seq_len - shared_len, page_size)
        # the prefix part of the table was written by earlier steps; this step writes from a random point
        write_start = rng.randint(0, prefix_len)
        table[row, :write_start] = torch.tensor(slots[:write_start], dtype=torch.int64)
        items.append(
            PlanItem(
                row=row,
                new_ids=[rng.randrange(100) for _ in range(extend_len)],
                computed_len=prefix_len,
                slots=slots[write_start:],
                write_start=write_start,
            )
        )
    fb = build_forward_batch(items, table)
    assert fb.num_decode == len(decode_lens)
    assert len(set(fb.out_slots.tolist())) == fb.num_tokens, (
        "two requests write one slot: a broken test batch"
    )
    return fb, num_slots


def run_both(
    fb,
    num_slots: int,
    num_q_heads: int,
    dtype=torch.float32,
    seed: int = 0,
    softcap: float | None = None,
    **backend_kw,
):
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
    scale = HEAD_DIM**-0.5
    expected = reference_attention(q, ref_k, ref_v, fb, scale, softcap=softcap)

    backend = TorchAttentionBackend(num_q_heads, NUM_KV_HEADS, HEAD_DIM, **backend_kw)
    fb.attn_meta = None
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, k_cache, v_cache, fb, scale, softcap=softcap)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v), (
        "new K/V not written at out_slots"
    )
    # a second layer reuses the same metadata (and its gather workspaces)
    out2 = backend.forward(q, k, v, k_cache, v_cache, fb, scale, softcap=softcap)
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
    # runs of short and long extends (drafts beside prefill chunks) padded apart
    "short_long_short_runs": (
        [40, 9],
        [(30, 5), (12, 17), (0, 70), (5, 40), (90, 3), (0, 1), (2, 33)],
    ),
    # one long chunk after its cached prefix: "prefix, unmasked" + "itself, causal", merged
    "long_chunk_after_prefix": ([], [(70, 50)]),
    "long_chunk_after_prefix_beside_decodes_and_drafts": ([12, 40], [(3, 4), (100, 64), (20, 2)]),
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


def test_short_and_long_extends_are_padded_apart():
    """Short extends after a cached prefix right behind the decodes join the decode group (drafts to
    verify); other runs of short and long extends are padded apart."""
    rng = random.Random(11)
    fb, num_slots = make_batch(
        rng, [40, 9], [(30, 5), (12, 17), (0, 70), (5, 40), (90, 3), (0, 1), (2, 33)], 16
    )
    out, out2, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, seed=1)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    d = fb.attn_meta.decode
    assert d.num_reqs == 1 + 1 + 5 + 17  # a row per new token
    runs = [(e.num_reqs, e.q_len) for e in fb.attn_meta.extends]
    assert runs == [(2, 70), (2, 3), (1, 33)], runs


def test_fresh_short_prompt_stays_out_of_the_decode_group():
    rng = random.Random(12)
    fb, num_slots = make_batch(rng, [40], [(0, 5), (12, 3)], 1)
    out, _, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, seed=2)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    assert fb.attn_meta.decode.num_reqs == 1 and [e.num_reqs for e in fb.attn_meta.extends] == [2]


@pytest.mark.parametrize("seed", range(6))
def test_random_batches(seed):
    rng = random.Random(seed)
    page_size = rng.choice([1, 2, 16])
    decode_lens = [rng.randint(1, 90) for _ in range(rng.randint(0, 5))]
    extends = [
        (rng.choice([0, rng.randint(0, 60)]), rng.randint(1, 40)) for _ in range(rng.randint(0, 4))
    ]
    if not decode_lens and not extends:
        extends = [(0, 3)]
    fb, num_slots = make_batch(rng, decode_lens, extends, page_size)
    out, _, expected = run_both(fb, num_slots, rng.choice([1, 3, 4]) * NUM_KV_HEADS, seed=seed)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


# (decode_lens, extends, shared_lens per request, expected cascade length of (decode, extend) group)
SHARED_SCENARIOS = {
    "decode_long_shared": ([100, 130, 97, 101, 250], [], [96] * 5, (96, None)),
    "decode_equal_lens": ([70, 70, 70], [], [64] * 3, (64, None)),
    "decode_page_unaligned": ([300, 310, 305, 301, 330, 400], [], [299] * 6, (299, None)),
    "decode_below_threshold": ([60, 80, 45], [], [20] * 3, (None, None)),
    # the second request's whole prefix (40) lies inside what the others share (100): S stops at 40
    "decode_one_short_prefix": ([120, 40, 150, 110], [], [100, 40, 100, 100], (40, None)),
    "decode_short_prefix_below_threshold": ([120, 20, 150], [], [100, 20, 100], (None, None)),
    # long extends (> SHORT_EXTEND_LEN new tokens) form groups of their own
    "extends_shared": ([], [(64, 40), (80, 37), (70, 33)], [64] * 3, (None, 64)),
    # the second extend writes positions 40..79 into slots the others read as cached prefix this step
    "extend_new_tokens_inside_shared": (
        [90, 72],
        [(70, 35), (40, 40), (75, 33)],
        [70] * 5,
        (70, 40),
    ),
    "mixed_both_shared": (
        [50, 61, 45],
        [(48, 39), (45, 33), (100, 40)],
        [45, 45, 45, 48, 45, 48],
        (45, 45),
    ),
    "fresh_prompt_beside_shared": (
        [64, 64],
        [(0, 30), (60, 4), (60, 8)],
        [60, 60, 0, 60, 60],
        (60, None),
    ),
    "single_request_groups": ([200], [(150, 40)], [150, 150], (None, None)),
    # short extends after a cached prefix (drafts to verify, prompt tails) join the decodes' group
    "drafts_join_decodes": ([100, 130, 97], [(98, 5), (120, 3), (96, 17)], [96] * 6, (96, None)),
    "short_extends_alone_share": ([], [(64, 5), (80, 17), (70, 1)], [64] * 3, (64, None)),
    # a draft's new tokens start at 70: the group's shared part stops there
    "draft_inside_shared": ([90, 95], [(70, 5), (88, 2)], [80, 80, 75, 80], (70, None)),
}


def cascade_lens(fb) -> tuple[int | None, int | None]:
    meta = fb.attn_meta
    assert len(meta.extends) <= 1  # these scenarios keep all their extends in one run
    return tuple(
        g.shared.kv_len if g is not None and g.shared is not None else None
        for g in (meta.decode, meta.extends[0] if meta.extends else None)
    )


@pytest.mark.parametrize("consecutive", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("scenario", list(SHARED_SCENARIOS))
def test_shared_prefix_matches_reference(scenario, group, page_size, consecutive):
    decode_lens, extends, shared_lens, expected_lens = SHARED_SCENARIOS[scenario]
    rng = random.Random(zlib.crc32(f"shared/{scenario}/{group}/{page_size}/{consecutive}".encode()))
    fb, num_slots = make_batch(
        rng,
        decode_lens,
        extends,
        page_size,
        shared_lens=shared_lens,
        consecutive_shared=consecutive,
    )
    out, out2, expected = run_both(
        fb, num_slots, group * NUM_KV_HEADS, seed=rng.randrange(1000), min_saved_kv=0
    )
    assert cascade_lens(fb) == expected_lens
    meta = fb.attn_meta
    for g in (meta.decode, *meta.extends):  # read in place exactly when the run is consecutive
        if g is not None and g.shared is not None:
            assert (g.shared.first_slot is not None) == consecutive
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out2, expected, atol=2e-5, rtol=1e-5)


# seeds whose batches take the cascade in both groups, in one, and in neither
SHARED_SEED_BASE = 5000


@pytest.mark.parametrize("seed", range(8))
def test_random_shared_batches(seed):
    rng = random.Random(SHARED_SEED_BASE + seed)
    common_len = rng.choice([0, rng.randint(1, 40), rng.randint(30, 150), rng.randint(30, 150)])
    decode_lens = [rng.randint(common_len + 1, common_len + 40) for _ in range(rng.randint(0, 5))]
    extends = [
        (
            rng.choice([rng.randint(0, common_len + 20), common_len + rng.randint(0, 20)]),
            rng.randint(2, 30),
        )
        for _ in range(rng.randint(0, 4))
    ]
    if not decode_lens and not extends:
        extends = [(common_len + 3, 2)]
    # decodes share all of the common run; an extend takes part of it, its new tokens at most once inside
    shared_lens = [common_len] * len(decode_lens)
    writer_used = False
    for prefix_len, extend_len in extends:
        shared = min(common_len, prefix_len + extend_len)
        if shared > prefix_len:
            shared = prefix_len if writer_used else shared
            writer_used = True
        shared_lens.append(rng.choice([shared, shared, rng.randint(0, shared)]))
    fb, num_slots = make_batch(
        rng, decode_lens, extends, rng.choice([1, 2, 16]), shared_lens=shared_lens
    )
    out, _, expected = run_both(
        fb, num_slots, rng.choice([1, 3, 4]) * NUM_KV_HEADS, seed=seed, min_saved_kv=0
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_cascade_off_and_threshold():
    """min_shared_len=None keeps the padded path; the threshold is inclusive; results agree either way."""
    rng = random.Random(3)
    n = CASCADE_MIN_SHARED_LEN
    fb, num_slots = make_batch(rng, [n + 5, n + 9], [(n, 34), (n + 2, 36)], 16, shared_lens=[n] * 4)
    out_on, _, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_saved_kv=0)
    assert cascade_lens(fb) == (n, n)
    out_off, _, _ = run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_shared_len=None, min_saved_kv=0)
    assert cascade_lens(fb) == (None, None)
    run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_shared_len=n + 1, min_saved_kv=0)
    assert cascade_lens(fb) == (None, None)
    saved = 1 * n * NUM_KV_HEADS * HEAD_DIM  # per group: (2 requests - 1) x n shared positions
    run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_saved_kv=saved)
    assert cascade_lens(fb) == (n, n)
    run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_saved_kv=saved + 1)
    assert cascade_lens(fb) == (None, None)
    torch.testing.assert_close(out_on, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out_off, expected, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="min_shared_len"):
        TorchAttentionBackend(6, 2, 16, min_shared_len=0)


def test_default_thresholds_take_cascade_where_it_pays():
    """Defaults on the SmolLM2 attention shape: the few-shot decode batch (16 x 600 shared) takes the
    cascade; two requests sharing 64 positions or 16 sharing 32 do not (they measured slower)."""
    backend = TorchAttentionBackend(9, 3, 64)
    for num_reqs, shared_len, expected in (
        (16, 600, 600),
        (2, 64, None),
        (16, 32, None),
        (2, 600, 600),
    ):
        fb, _ = make_batch(
            random.Random(num_reqs),
            [shared_len + 40] * num_reqs,
            [],
            16,
            max_rows=num_reqs,
            max_context=shared_len + 41,
            shared_lens=[shared_len] * num_reqs,
        )
        backend.init_forward_metadata(fb)
        assert cascade_lens(fb) == (expected, None), (num_reqs, shared_len)


def test_attend_lse_matmul_matches_cpu_kernel():
    """The non-CPU fallback against the CPU flash kernel: GQA, a padding mask, output and log-sum-exp."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 8, 5, 16, generator=g)
    k, v = torch.randn(3, 2, 11, 16, generator=g), torch.randn(3, 2, 11, 16, generator=g)
    mask = torch.zeros(3, 1, 5, 11)
    mask[1, :, :, 7:] = float("-inf")
    mask[2, :, 2:, :3] = float("-inf")
    for m in (None, mask):
        out, lse = _attend_lse(q, k, v, m, 0.25)
        out_ref, lse_ref = attend_lse_matmul(q, k, v, m, 0.25)
        assert lse.shape == (3, 8, 5) and lse.dtype == torch.float32
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, lse_ref, atol=1e-5, rtol=1e-5)


def test_cascade_with_matmul_fallback(monkeypatch):
    """The whole cascade through the explicit-matmul path that devices without the CPU kernel take."""
    monkeypatch.setattr(attention_torch, "_attend_lse", attend_lse_matmul)
    decode_lens, extends, shared_lens, expected_lens = SHARED_SCENARIOS["mixed_both_shared"]
    fb, num_slots = make_batch(random.Random(5), decode_lens, extends, 16, shared_lens=shared_lens)
    out, _, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, min_saved_kv=0)
    assert cascade_lens(fb) == expected_lens
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_bfloat16_cascade_close_to_reference():
    rng = random.Random(8)
    fb, num_slots = make_batch(rng, [80, 95, 70], [(72, 39), (66, 34)], 16, shared_lens=[64] * 5)
    out, _, expected = run_both(
        fb, num_slots, 3 * NUM_KV_HEADS, dtype=torch.bfloat16, min_saved_kv=0
    )
    assert cascade_lens(fb) == (64, 64) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_bfloat16_close_to_reference():
    rng = random.Random(7)
    fb, num_slots = make_batch(rng, [12, 30], [(0, 9), (5, 4)], page_size=16)
    out, _, expected = run_both(fb, num_slots, 3 * NUM_KV_HEADS, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_reference_is_causal_softmax():
    """The reference itself against a hand computation: one request, one head, 2 cached + 2 new tokens."""
    table = torch.zeros((1, 8), dtype=torch.int64)
    fb = build_forward_batch(
        [PlanItem(row=0, new_ids=[1, 2], computed_len=2, slots=[3, 1, 0, 2], write_start=0)], table
    )
    k_cache = torch.randn(4, 1, 2)
    v_cache = torch.randn(4, 1, 2)
    q = torch.randn(2, 1, 2)
    out = reference_attention(q, k_cache, v_cache, fb, scale=0.5)
    order = torch.tensor([3, 1, 0, 2])  # slots of positions 0..3
    for i, visible in enumerate((3, 4)):  # token at position 2 sees 0..2, position 3 sees 0..3
        keys, values = k_cache[order[:visible], 0], v_cache[order[:visible], 0]
        weights = torch.softmax(keys @ q[i, 0] * 0.5, dim=0)
        torch.testing.assert_close(out[i, 0], weights @ values)


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("scenario", list(SCENARIOS) + [f"shared/{n}" for n in SHARED_SCENARIOS])
def test_softcapped_scores_match_reference(scenario, group):
    """Gemma 2's soft-capped scores, tanh(s / cap) * cap, on every path: decodes, padded extends,
    a fresh prompt, a chunk after its prefix, and the cascade over a shared prefix (merging by
    log-sum-exp is still exact: the cap is applied per score)."""
    name = scenario.removeprefix("shared/")
    rng = random.Random(zlib.crc32(f"softcap/{scenario}/{group}".encode()))
    if scenario.startswith("shared/"):
        decode_lens, extends, shared_lens, _ = SHARED_SCENARIOS[name]
        fb, num_slots = make_batch(rng, decode_lens, extends, 16, shared_lens=shared_lens)
        kw = {"min_saved_kv": 0}
    else:
        fb, num_slots = make_batch(rng, *SCENARIOS[name], 16)
        kw = {}
    seed = rng.randrange(1000)
    out, out2, expected = run_both(
        fb, num_slots, group * NUM_KV_HEADS, seed=seed, softcap=0.7, **kw
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(out2, expected, atol=2e-5, rtol=1e-5)
    if max(fb.seq_lens_list) > 1:  # a query seeing one key gets its value, capped or not
        fb.attn_meta = None
        uncapped = run_both(fb, num_slots, group * NUM_KV_HEADS, seed=seed, **kw)[0]
        assert not torch.allclose(uncapped, expected, atol=1e-3), "the cap changed nothing"
