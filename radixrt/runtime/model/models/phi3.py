"""Phi-3: Llama's decoder with q/k/v fused into one qkv_proj and gate/up into one gate_up_proj in
the checkpoint (gate rows first), optionally a sliding window on every layer. The fused tensors are
split into Llama's names as the checkpoint is read, so tensor parallel shards and the 4-bit copies
see the same names as a Llama's; the rope types Llama supports are Phi-3's short-context ones
(the 128k models' longrope is refused by name)."""

from __future__ import annotations

import torch

from radixrt.runtime.model.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def standard_names(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        q_rows = c.num_attention_heads * D
        kv_rows = (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) * D
        out = {}
        for name, t in sd.items():
            if name.endswith("self_attn.qkv_proj.weight"):
                p = name.removesuffix("qkv_proj.weight")
                q, k, v = torch.split(t, [q_rows, kv_rows, t.shape[0] - q_rows - kv_rows])
                out.update({p + "q_proj.weight": q, p + "k_proj.weight": k, p + "v_proj.weight": v})
            elif name.endswith("mlp.gate_up_proj.weight"):
                p = name.removesuffix("gate_up_proj.weight")
                gate, up = t.chunk(2)
                out.update({p + "gate_proj.weight": gate, p + "up_proj.weight": up})
            else:
                out[name] = t
        return out
