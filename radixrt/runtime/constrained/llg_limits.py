"""How llguidance is driven within bounds (llg_backend.py): its parser limits, set explicitly, and
the mask filled without importing llguidance.torch."""

from __future__ import annotations

from typing import Any

import torch

# llguidance's parser limits, set here rather than left to its defaults (#56.8). Its lexer builds
# lazily, in the scheduler's step: with the default initial lexer fuel (1,000,000) a schema pattern
# ((a{99}){99}){99} ran 1.5 s into its first mask before the lexer gave up; at 100,000 it gives up
# in ~0.1 s, while every schema of the test suites' 63 builds its first mask in < 5 ms. The other
# limits are llguidance's defaults, written out so an upgrade cannot loosen them unseen; errors
# are not verbose (a verbose one prints the parser state, the client's text, into the log).
PARSER_LIMITS = dict(
    initial_lexer_fuel=100_000,
    step_lexer_fuel=100_000,
    step_max_items=50_000,
    max_items_in_row=2_000,
    max_lexer_states=250_000,
    max_grammar_size=500_000,
    verbose_errors=False,
)


def fill_mask(matcher: Any, words: torch.Tensor) -> None:
    """The matcher's allowed tokens into words (one row of int32 bits). What
    llguidance.torch.fill_next_token_bitmask does, without importing that module: its import runs a
    torch.compile decorator (~5 s of importing dynamo), which landed in the scheduler's step on the
    first llguidance request of a server running eager."""
    if not (words.dtype == torch.int32 and words.is_cpu and words.is_contiguous()):
        raise ValueError("a mask row is a contiguous int32 CPU tensor")
    matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
