"""The lm_head: hidden states -> float32 logits, exact where a decision is made.

A bf16 GEMM accumulates in float32 but rounds its output to bf16: at logits around 16-32 that is a
step of 0.125, so two tokens closer than that tie after rounding and greedy picks between them by
chance. That rounding, not the bf16 matmul inputs, was the largest single precision loss of
radixrt's bf16 path: teacher-forced top-1 agreement with transformers fp32 on bench_kv_cache's 24
prompts went 97.2% -> 98.0% with a float32 lm_head output. A float32 GEMM over the whole vocabulary
would double the lm_head's cost, so only the logits that can matter are recomputed: every token
whose rounded logit is within two bf16 steps of its row's rounded maximum (which includes the true
maximum: each value is off by at most half a step) is recomputed in float32 from the same bf16
inputs, and the rest keep their rounded values. Greedy decisions and the top tokens' logprobs are
then those of a float32-output GEMM; the far tail (which only moves a softmax sum by rounding noise)
is unchanged.
"""

from __future__ import annotations

import torch

from radixrt.runtime.model.linear import DENSE, INVARIANT, Linear

BF16_MANTISSA_BITS = 7
BLOCK = 64


class LogitsHead:
    def __init__(self, weight: torch.Tensor, copies=None):
        """weight [vocab, H]: the lm_head (or the tied embedding), kept plain for the recomputed
        rows; copies: its integer forms (linear.IntCopies), read where the weight plan says."""
        self.linear = Linear(weight, copies=copies)
        self.weight = weight  # the tied embedding's own tensor when tied: no second copy

    @property
    def refine(self) -> bool:
        """Whether the near-max logits are recomputed: the GEMM rounds its output to a half type,
        or reads integer weights (whose error, ~0.01 at these logits, is well inside the margin)."""
        return self.weight.dtype in (torch.bfloat16, torch.float16) or any(
            f not in (DENSE, INVARIANT) for f in self.linear.plan[1::2]
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, H] in the model dtype -> logits [R, vocab] float32."""
        logits = self.linear(x).float()
        if self.refine:
            refine_near_max(logits, x, self.weight)
        return logits


def near_max_margin(row_max: torch.Tensor) -> torch.Tensor:
    """Two bf16 steps at |row_max|'s binade, rounded up to the next binade's step (a token just
    below a negative maximum has a larger magnitude)."""
    exponent = torch.floor(torch.log2(row_max.abs().clamp_min(2.0**-100))) + 1
    return torch.exp2(exponent - BF16_MANTISSA_BITS + 1)


def near_max(logits: torch.Tensor, threshold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the logits >= their row's threshold. A scan of the whole [R, vocab]
    comparison costs ~1 ms at 16 rows on a small CPU: blocks of BLOCK columns are screened by their
    maxima first, and only the few blocks that reach the threshold are compared element by
    element."""
    num_rows, vocab = logits.shape
    if vocab % BLOCK:
        return torch.nonzero(logits >= threshold[:, None], as_tuple=True)
    blocks = logits.view(num_rows, vocab // BLOCK, BLOCK)
    block_rows, block_ids = torch.nonzero(blocks.amax(-1) >= threshold[:, None], as_tuple=True)
    hit, offset = torch.nonzero(
        blocks[block_rows, block_ids] >= threshold[block_rows, None], as_tuple=True
    )
    return block_rows[hit], block_ids[hit] * BLOCK + offset


def refine_near_max(logits: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Recompute in float32, in place, every logit within near_max_margin of its row's maximum."""
    row_max = logits.amax(dim=-1)  # [R]
    rows, cols = near_max(logits, row_max - near_max_margin(row_max))
    exact = (x.index_select(0, rows).float() * weight.index_select(0, cols).float()).sum(-1)  # [N]
    logits[rows, cols] = exact
