"""What Gemma 2 and Gemma 3 share, on Llama's attention path:

- RMSNorm scales by (1 + weight), in float32: the stored weights become 1 + w once at load, and
  the Llama norms then compute Gemma's formula;
- "sandwich" norms: the attention output and the MLP output are normed before each joins the
  residual stream (post_attention_layernorm, post_feedforward_layernorm), the MLP input by
  pre_feedforward_layernorm;
- the embedding scaled by sqrt(hidden_size) in the model dtype; gelu (tanh) in the gated MLP;
- attention scaled by query_pre_attn_scalar ** -0.5, sliding and global layers as layer_types says;
- logit soft-capping where the config sets it: tanh(x / cap) * cap of the attention scores
  (attn_logit_softcapping, the attention backend's `softcap`) and of the final logits.

Gemma 3 adds per-head q/k norms (Llama's Qwen3 path, 1 + w) and its own RoPE base for the sliding
layers. The layers run eager one at a time; tensor parallelism, LoRA and 4-bit copies are refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixrt.runtime.model.models import llama_layer
from radixrt.runtime.model.models.llama import LlamaForCausalLM
from radixrt.runtime.model.models.llama_weights import (
    LayerWeights,
    WeightReader,
    WeightShapes,
    check_shape,
    read_layer,
)
from radixrt.runtime.model.models.positions import rope_tables


class GemmaFamilyForCausalLM(LlamaForCausalLM):
    compilable = supports_tp = supports_lora = supports_int_copies = False
    layerwise = True

    def __init__(self, hf_config, dtype=torch.float32, device="cpu", shard=None, tp=None):
        assert shard is None and tp is None, "supports_tp is False: the runner refuses TP first"
        super().__init__(hf_config, dtype, device)
        self.scale = hf_config.query_pre_attn_scalar**-0.5
        self.attn_softcap = getattr(hf_config, "attn_logit_softcapping", None)
        self.final_softcap = getattr(hf_config, "final_logit_softcapping", None)
        self.embed_scale = torch.tensor(self.hidden_size**0.5, dtype=dtype)
        self.ff_norms: list[tuple[torch.Tensor, torch.Tensor]] = []  # (pre, post) per layer
        # the sliding layers' RoPE (Gemma 3's own base), else the same tables
        cos, sin = rope_tables(hf_config, self.head_dim, self.max_context, "sliding_attention")
        self.local_cos = torch.cat((cos, cos), -1).to(device=self.device, dtype=self.rope_dtype)
        self.local_sin = torch.cat((-sin, sin), -1).to(device=self.device, dtype=self.rope_dtype)

    def _check_activation(self, hf_config) -> None:
        act = getattr(hf_config, "hidden_activation", None) or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(
                f"hidden_activation {act!r} is not supported (expected gelu_pytorch_tanh)"
            )

    def load_weights(self, state_dict: dict[str, torch.Tensor], copies: bool = False) -> None:
        self.ff_norms = []
        super().load_weights(state_dict, copies)
        self.final_norm = 1.0 + self.final_norm

    def _read_layer(self, r: WeightReader, i: int, s: WeightShapes) -> LayerWeights:
        layer = read_layer(r, i, s)
        layer.input_norm = 1.0 + layer.input_norm
        layer.post_norm = 1.0 + layer.post_norm
        if layer.qk_norm is not None:
            layer.qk_norm = 1.0 + layer.qk_norm.float()
        p = f"layers.{i}."
        pre, post = (
            1.0 + check_shape(p + n, r.take(p + n + ".weight"), (s.hidden,)).float()
            for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        )
        self.ff_norms.append((pre, post))
        return layer

    def _rope_rows(self, positions: torch.Tensor) -> tuple:
        local = (
            self.local_cos.index_select(0, positions)[:, None, :],
            self.local_sin.index_select(0, positions)[:, None, :],
        )
        return (*super()._rope_rows(positions), *local)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return (F.embedding(ids, self.embed) * self.embed_scale).float()

    def _attention_args(self, i: int, rope: tuple) -> tuple:
        """A sliding layer reads the local RoPE rows (_rope_rows' last pair)."""
        return super()._attention_args(i, rope[2:] if self.layer_windows[i] is not None else rope)

    def _attention_kwargs(self, i: int) -> dict:
        kwargs = super()._attention_kwargs(i)
        if self.attn_softcap:
            kwargs["softcap"] = self.attn_softcap
        return kwargs

    def _feed_forward(self, i: int, h: torch.Tensor, o: torch.Tensor, lora) -> torch.Tensor:
        d, layer = self.eager_dims, self.layers[i]
        pre, post = self.ff_norms[i]
        attn_out = layer.o(o.reshape(o.shape[0], d.num_q_heads * d.head_dim).to(d.dtype))
        h = h + llama_layer.norm(d, attn_out.float(), layer.post_norm)
        gu = layer.gate_up(llama_layer.norm(d, h, pre))
        inter = gu.shape[1] // 2
        mlp = layer.down(F.gelu(gu[:, :inter], approximate="tanh") * gu[:, inter:])
        return h + llama_layer.norm(d, mlp.float(), post)

    def _logits(self, h, o, fb, graphs, lora=None) -> torch.Tensor:
        logits = super()._logits(h, o, fb, graphs, lora)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
