"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, no biases), experts as Qwen2-MoE's without
the shared expert; norm_topk_prob decides whether the top-k weights are renormalised."""

from __future__ import annotations

from radixrt.runtime.model.models.moe_model import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    pass
