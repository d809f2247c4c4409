"""The fused-MoE Triton path (kernels/moe_triton.py) under the interpreter against the CPU path
(model/models/moe_layer.py experts): float32 and bfloat16, several token counts, expert counts and
top-k, hidden and intermediate sizes that are not multiples of the tiles, and an expert that no
token chooses; and moe_align's sort and padding on their own."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.moe_triton import fused_experts, moe_align
from radixrt.runtime.model.models import moe_layer

HIDDEN, INTER = 48, 40  # the interpreter's tiles are 32 wide: both cross a tile border


def make_case(num_tokens, num_experts, top_k, dtype, seed=0):
    """Random weights and a routing that never picks the last expert."""
    gen = torch.Generator().manual_seed(seed)
    w = moe_layer.MoeWeights(
        router=torch.randn(num_experts, HIDDEN, generator=gen).to(dtype),
        gate_up=(torch.randn(num_experts, 2 * INTER, HIDDEN, generator=gen) * HIDDEN**-0.5).to(
            dtype
        ),
        down=(torch.randn(num_experts, HIDDEN, INTER, generator=gen) * INTER**-0.5).to(dtype),
        top_k=top_k,
        renormalize=True,
    )
    x = torch.randn(num_tokens, HIDDEN, generator=gen).to(dtype)
    ids = torch.rand(num_tokens, num_experts - 1, generator=gen).argsort(dim=1)[:, :top_k]
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=-1).to(dtype)
    return x, weights, ids, w


CASES = [(1, 4, 1), (1, 8, 3), (7, 4, 2), (7, 8, 3), (33, 4, 3), (33, 8, 2), (33, 8, 1)]
# bf16: the two paths round the same gate_up rows, but may land a row one ulp apart
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", CASES)
def test_fused_experts_equal_the_cpu_path(num_tokens, num_experts, top_k, dtype):
    x, weights, ids, w = make_case(num_tokens, num_experts, top_k, dtype)
    want = moe_layer.experts(x, weights, ids, w)
    got = fused_experts(x, weights, ids, w.gate_up, w.down)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_fused_experts_after_the_router():
    """Through moe_layer.route: the ids and weights the model feeds it, ties and all."""
    x, _, _, w = make_case(20, 8, 2, torch.float32, seed=1)
    weights, ids = moe_layer.route(x, w)
    want = moe_layer.experts(x, weights, ids, w)
    got = fused_experts(x, weights, ids, w.gate_up, w.down)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m", [(33, 8, 3, 16), (5, 4, 2, 4)])
def test_moe_align_groups_every_pair_once_by_expert(num_tokens, num_experts, top_k, block_m):
    _, _, ids, _ = make_case(num_tokens, num_experts, top_k, torch.float32)
    flat = ids.reshape(-1)
    num_pairs = flat.numel()
    align = moe_align(ids, num_experts, block_m)
    sorted_ids = align.sorted_ids.long()
    real = sorted_ids[sorted_ids < num_pairs]
    assert torch.equal(real.sort().values, torch.arange(num_pairs)), "a pair missing or repeated"
    assert torch.all(sorted_ids[sorted_ids >= num_pairs] == num_pairs), "padding not the sentinel"
    counts = torch.bincount(flat, minlength=num_experts)
    assert counts[-1] == 0  # the expert no token chose: no blocks of its own
    padded = int(((counts + block_m - 1) // block_m * block_m).sum())
    assert int(align.num_padded) == padded
    assert torch.all(sorted_ids[padded:] == num_pairs)
    used_blocks = padded // block_m
    assert torch.all(align.block_expert[used_blocks:] == -1)
    blocks_per_expert = (counts + block_m - 1) // block_m
    expected_blocks = torch.repeat_interleave(torch.arange(num_experts), blocks_per_expert)
    assert torch.equal(align.block_expert[:used_blocks].long(), expected_blocks)
    for b in range(used_blocks):
        rows = sorted_ids[b * block_m : (b + 1) * block_m]
        rows = rows[rows < num_pairs]
        assert len(rows) > 0, "a block of padding only"
        assert torch.all(flat[rows] == align.block_expert[b]), f"block {b} mixes experts"
