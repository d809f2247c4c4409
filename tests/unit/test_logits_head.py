"""The lm_head's near-max refinement against a float32 GEMM of the same bf16 inputs (the truth): every row's
argmax equals float32's, the recomputed logits equal float32's values, and the block screen finds exactly
the logits a plain comparison finds."""

from __future__ import annotations

import pytest
import torch

from radixrt.runtime.model.logits_head import LogitsHead, near_max, near_max_margin


@pytest.mark.parametrize("rows,vocab", [(1, 4096), (16, 4096), (7, 1000)])  # 1000: no whole blocks
def test_refined_logits_decide_like_a_float32_gemm(rows, vocab):
    torch.manual_seed(rows)
    weight = (torch.randn(vocab, 64) * 0.5).bfloat16()
    x = (torch.randn(rows, 64) * 4).bfloat16()
    # near-ties at the top: copies of the best row's weight with a tiny change, which bf16 output rounding merges
    truth = x.float() @ weight.float().t()
    best = truth.argmax(-1)
    for r in range(rows):
        for j in range(1, 4):
            weight[(best[r] + 97 * j) % vocab] = weight[best[r]]
            weight[(best[r] + 97 * j) % vocab, j] += 0.01 * j
    truth = x.float() @ weight.float().t()
    head = LogitsHead(weight)
    logits = head(x)
    rounded = (x @ weight.t()).float()
    # the case rounding gets wrong
    assert (rounded.argmax(-1) != truth.argmax(-1)).any() or rows == 1
    assert torch.equal(logits.argmax(-1), truth.argmax(-1))
    changed = logits != rounded
    torch.testing.assert_close(logits[changed], truth[changed], rtol=1e-6, atol=1e-5)
    # untouched logits are the bf16 ones: within half a bf16 step of the truth
    assert (logits - truth).abs().max() <= truth.abs().max() * 2**-8


def test_block_screen_finds_what_a_plain_comparison_finds():
    torch.manual_seed(0)
    logits = torch.randn(5, 64 * 40) * 8
    logits[2, 100:110] = logits[2].max()  # a run of ties
    row_max = logits.amax(-1)
    threshold = row_max - near_max_margin(row_max)
    rows, cols = near_max(logits, threshold)
    want = torch.nonzero(logits >= threshold[:, None], as_tuple=True)
    assert sorted(zip(rows.tolist(), cols.tolist())) == sorted(
        zip(want[0].tolist(), want[1].tolist())
    )


def test_float32_heads_are_left_alone():
    weight = torch.randn(100, 8)
    x = torch.randn(3, 8)
    assert not LogitsHead(weight).refine
    torch.testing.assert_close(LogitsHead(weight)(x), x @ weight.t())
