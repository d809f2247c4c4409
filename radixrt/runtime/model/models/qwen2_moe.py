"""Qwen2-MoE: Qwen2's attention (q/k/v biases), experts in the layers decoder_sparse_step and
mlp_only_layers make sparse, plus a shared expert scaled by a sigmoid gate; norm_topk_prob decides
whether the top-k weights are renormalised."""

from __future__ import annotations

from radixrt.runtime.model.models.moe_model import MoeForCausalLM


class Qwen2MoeForCausalLM(MoeForCausalLM):
    shared_expert = True
