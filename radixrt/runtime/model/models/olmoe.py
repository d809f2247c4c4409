"""OLMoE: q/k RMSNorm over each whole projection (not per head), experts in every layer sized by
intermediate_size, the top-k weights renormalised only where norm_topk_prob says so (the released
models: not)."""

from __future__ import annotations

import torch

from radixrt.runtime.model.models.moe_model import MoeForCausalLM


class OlmoeForCausalLM(MoeForCausalLM):
    expert_intermediate_field = "intermediate_size"

    def __init__(self, hf_config, dtype=torch.float32, device="cpu", shard=None, tp=None):
        if getattr(hf_config, "clip_qkv", None) is not None:
            raise ValueError("OLMoE with clip_qkv set is not supported (the released models: null)")
        super().__init__(hf_config, dtype, device, shard, tp)
