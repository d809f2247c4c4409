"""What the mixture-of-experts families share: a Llama-shaped decoder whose feed-forward is a set of
experts (moe_layer.py) in the layers the config makes sparse, a plain gated MLP in the others.

A family file (mixtral.py, qwen2_moe.py, qwen3_moe.py, olmoe.py) names where its checkpoint keeps
the router and the experts and which config fields size them; attention, the paged pool, radix
reuse, sliding windows and quantised KV are the Llama path's own. The layers run eager one at a
time (the compiled seams are Llama's dense layers). Under tensor parallelism each rank holds a
slice of every expert's intermediate size (tp_shard.py) and the expert outputs join the attention's
in the all-reduce after each; LoRA and the 4-bit copies are refused for these models by name.
"""

from __future__ import annotations

import torch

from radixrt.runtime.model.models import llama_layer, moe_layer
from radixrt.runtime.model.models.llama import LlamaForCausalLM
from radixrt.runtime.model.models.llama_weights import (
    LayerWeights,
    WeightReader,
    WeightShapes,
    check_shape,
    read_layer,
    read_mlp,
)


class MoeForCausalLM(LlamaForCausalLM):
    compilable = supports_lora = supports_int_copies = supports_deterministic = False
    layerwise = True
    # where a sparse layer keeps its router ("gate") and experts, and the experts' projections
    moe_prefix = "mlp."
    expert_names = ("gate_proj", "up_proj", "down_proj")
    num_experts_field = "num_experts"
    expert_intermediate_field = "moe_intermediate_size"
    shared_expert = False  # Qwen2-MoE: shared_expert + shared_expert_gate

    def __init__(self, hf_config, dtype=torch.float32, device="cpu", shard=None, tp=None):
        super().__init__(hf_config, dtype, device, shard, tp)
        self.num_experts = getattr(hf_config, self.num_experts_field)
        self.top_k = hf_config.num_experts_per_tok
        ranks = shard.size if shard is not None else 1
        # this rank's slice of each expert (tp_shard.py checked that the ranks divide it)
        self.expert_intermediate = getattr(hf_config, self.expert_intermediate_field) // ranks
        self.shared_intermediate = getattr(hf_config, "shared_expert_intermediate_size", 0) // ranks
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.top_k} must be in 1..{self.num_experts} (the experts)"
            )

    @property
    def renormalize(self) -> bool:
        """Whether the top-k weights are divided by their sum."""
        return bool(getattr(self.config, "norm_topk_prob", False))

    def is_sparse(self, i: int) -> bool:
        """Layer i has experts (Qwen's decoder_sparse_step and mlp_only_layers make some dense)."""
        c = self.config
        if i in (getattr(c, "mlp_only_layers", None) or ()):
            return False
        step = getattr(c, "decoder_sparse_step", 1) or 1
        return self.num_experts > 0 and (i + 1) % step == 0

    def _read_layer(self, r: WeightReader, i: int, s: WeightShapes) -> LayerWeights:
        if not self.is_sparse(i):
            return read_layer(r, i, s)
        layer = read_layer(r, i, s, dense=False)
        layer.moe = self._read_experts(r, f"layers.{i}.", s.hidden)
        return layer

    def _expert_stacks(self, r: WeightReader, p: str) -> tuple[str, torch.Tensor, torch.Tensor]:
        """(the prefix of the router and experts, gate_up [E, 2 I, H], down [E, H, I]) from a
        checkpoint's per-expert projections, or from transformers 5's in-memory layout (every
        family under mlp., each layer's experts already stacked)."""
        if p + "mlp.experts.gate_up_proj" in r.sd:
            p += "mlp."
            return p, r.take(p + "experts.gate_up_proj"), r.take(p + "experts.down_proj")
        p += self.moe_prefix
        gate, up, down = self.expert_names
        expert = [f"{p}experts.{e}." for e in range(self.num_experts)]
        gate_up = torch.stack(
            [torch.cat((r.take(x + gate + ".weight"), r.take(x + up + ".weight"))) for x in expert]
        )
        return p, gate_up, torch.stack([r.take(x + down + ".weight") for x in expert])

    def _read_experts(self, r: WeightReader, p: str, H: int) -> moe_layer.MoeWeights:
        E, I = self.num_experts, self.expert_intermediate
        p, gate_up, downs = self._expert_stacks(r, p)
        w = moe_layer.MoeWeights(
            router=check_shape(p + "gate", r.take(p + "gate.weight"), (E, H)),
            gate_up=check_shape(p + "experts.gate_up", gate_up, (E, 2 * I, H)),
            down=check_shape(p + "experts.down", downs, (E, H, I)),
            top_k=self.top_k,
            renormalize=self.renormalize,
        )
        if self.shared_expert:
            shared = read_mlp(r, p + "shared_expert.", H, self.shared_intermediate)
            w.shared_gate_up, w.shared_down = shared["gate_up"], shared["down"]
            w.shared_gate = check_shape(
                p + "shared_expert_gate", r.take(p + "shared_expert_gate.weight"), (1, H)
            )
        return w

    def _feed_forward(self, i: int, h: torch.Tensor, o: torch.Tensor, lora) -> torch.Tensor:
        layer = self.layers[i]
        if layer.moe is None:
            return super()._feed_forward(i, h, o, lora)
        d = self.eager_dims
        h = h + self._reduce(layer.o(o.reshape(o.shape[0], d.num_q_heads * d.head_dim).to(d.dtype)))
        moe_out = moe_layer.feed_forward(llama_layer.norm(d, h, layer.post_norm), layer.moe)
        return h + self._reduce(moe_out)
