"""--enable-deterministic-inference on a loaded model: every linear (the layers' and the lm_head's)
reads its dense weight through the row-invariant matmul (invariant_matmul.py), checked on this
machine before the engine serves; attention is kernels/attention_deterministic.py's.

The default's cache-invariant prefill (--cache-invariant-prefill, on) runs the same kernels for the
steps that compute prompt KV only (computes_prompt), decode steps keeping the fast ones: the KV the
radix cache hands to a later request is then the bits that request would compute itself, so a warm
cache changes no answer of a request alone (a batch's decode rows still may: only the flag covers
those).

What else keeps a row's bits independent of its step, found by test (tests/unit/
test_deterministic_inference.py) rather than assumed: the norms, RoPE, SiLU and the residual adds
are per-row elementwise ops or reductions over one row's own hidden size; the sampler's softmax and
log_softmax reduce each row on its own, and a seeded row draws from its own generator.
"""

from __future__ import annotations

import logging

import torch

from radixrt.kernels.attention_deterministic import DeterministicAttentionBackend
from radixrt.runtime.model import invariant_matmul
from radixrt.runtime.model.linear import INVARIANT_ONLY, Linear

log = logging.getLogger(__name__)


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


def why_not_invariant_prompts(config, model, device: torch.device, tp):
    """Why the default's cache-invariant prefill is off here, or None (it is on). tp: the runner's
    tensor parallel group, or None."""
    if config.enable_deterministic_inference:
        return "the flag makes every step invariant"
    if not config.cache_invariant_prefill:
        return "--no-cache-invariant-prefill"
    if device.type != "cpu" or config.attention_backend == "triton":
        return "the torch attention backend on a CPU only"
    if tp is not None or config.lora_enabled:
        return "tensor parallelism and LoRA adapters run their own matmuls"
    if not getattr(model, "supports_deterministic", False):
        return f"{type(model).__name__} has no invariant kernels"
    return None


def prompt_backend(model, dtype: torch.dtype, why_not: str | None):
    """The attention backend of the steps that compute prompt KV, or None (they run as every other
    step): why_not, or the invariant matmul failing its check here (logged)."""
    if why_not is None:
        try:
            invariant_matmul.check([lin.weight for lin in linears(model)], dtype)
        except RuntimeError as e:
            why_not = str(e)
    log.info("cache-invariant prefill: %s", "on" if why_not is None else f"off ({why_not})")
    if why_not is not None:
        return None
    return DeterministicAttentionBackend(model.num_q_heads, model.num_kv_heads, model.head_dim)


def computes_prompt(plan) -> bool:
    """Whether a step computes prompt KV (a prefill chunk, a cached prompt's tail, a recompute):
    such a step runs the invariant kernels, so that KV (which the radix cache hands to later
    requests) and the logits it yields are the same bits in any batch."""
    return any(it.computed_len < len(it.prompt_ids) for it in plan)
