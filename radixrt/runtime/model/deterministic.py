"""--enable-deterministic-inference on a loaded model: every linear (the layers' and the lm_head's)
reads its dense weight through the row-invariant matmul (invariant_matmul.py), checked on this
machine before the engine serves; attention is kernels/attention_deterministic.py's.

What else keeps a row's bits independent of its step, found by test (tests/unit/
test_deterministic_inference.py) rather than assumed: the norms, RoPE, SiLU and the residual adds
are per-row elementwise ops or reductions over one row's own hidden size; the sampler's softmax and
log_softmax reduce each row on its own, and a seeded row draws from its own generator.
"""

from __future__ import annotations

import torch

from radixrt.runtime.model import invariant_matmul
from radixrt.runtime.model.linear import INVARIANT_ONLY, Linear


def linears(model) -> list[Linear]:
    """The model's Linears: each layer's, then the lm_head's."""
    found = [x for layer in model.layers for x in vars(layer).values() if isinstance(x, Linear)]
    return found + [model.lm_head.linear]


def apply(model, dtype: torch.dtype) -> None:
    """Set every linear to the invariant plan and check the matmul's invariance here (a
    RuntimeError naming the shape where it does not hold)."""
    if not getattr(model, "supports_deterministic", False):
        raise ValueError(
            f"{type(model).__name__}: --enable-deterministic-inference is not supported for this "
            "architecture (its experts' matmuls group a step's tokens by route)"
        )
    found = linears(model)
    for lin in found:
        lin.set_plan(INVARIANT_ONLY)
    invariant_matmul.check([lin.weight for lin in found], dtype)
