"""Mixtral: Mistral's attention, every layer's feed-forward a mixture of experts (block_sparse_moe:
experts w1 = gate, w3 = up, w2 = down), the top-k weights always renormalised."""

from __future__ import annotations

from radixrt.runtime.model.models.moe_model import MoeForCausalLM


class MixtralForCausalLM(MoeForCausalLM):
    moe_prefix = "block_sparse_moe."
    expert_names = ("w1", "w3", "w2")
    num_experts_field = "num_local_experts"
    expert_intermediate_field = "intermediate_size"

    @property
    def renormalize(self) -> bool:
        return True
