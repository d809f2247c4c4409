"""Llama-family forward (Llama, Mistral, Qwen2, Qwen3, SmolLM) over the paged KV pool.

Plain tensors, no nn.Module: this is the per-step hot path, and on a small CPU the Python
cost of each op matters as much as the matmuls. So q/k/v and gate/up are fused into one
weight each at load time, RoPE cos/sin come from a table indexed once per forward, and
logits are computed only for the rows the caller asked for. Formulas follow Hugging Face
(RMSNorm in float32, rotate-half RoPE, silu(gate) * up) so greedy output matches it exactly.
A layer's math is llama_layer.py's; reading a checkpoint into the fused weights, llama_weights.py's.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from radixrt.runtime.model.forward_batch import ForwardBatch
from radixrt.runtime.model.kv_cache import KVCache
from radixrt.runtime.model.logits_head import LogitsHead
from radixrt.runtime.model.models import llama_layer
from radixrt.runtime.model.models.llama_layer import LayerDims
from radixrt.runtime.model.models.llama_weights import (
    LayerWeights,
    WeightReader,
    WeightShapes,
    check_shape,
    read_layer,
    read_lm_head,
)
from radixrt.runtime.model.models.positions import layer_windows, rope_tables
from radixrt.runtime.model.tp_shard import Shard


class LlamaForCausalLM:
    # what this family supports beyond the plain forward (mixture-of-experts models say no)
    compilable = True  # the seams as torch.compile'd graphs (compiled_layers.py)
    supports_tp = True  # tensor parallel shards (tp_shard.py)
    supports_lora = True  # LoRA adapters on its projections (lora_pool.py)
    supports_int_copies = True  # integer forms of a quantised checkpoint (weight_plan.py)
    layerwise = False  # every layer eager and one at a time (its feed-forward is its own)
    supports_deterministic = True  # --enable-deterministic-inference (model/deterministic.py)

    def __init__(
        self,
        hf_config,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        shard: Shard | None = None,
        tp: Any = None,
    ):
        """shard/tp: this rank's part of a tensor parallel model (tp_shard.py) and its group
        (tp.py): the head, intermediate and vocabulary sizes below are then this rank's, and
        load_weights takes its slices."""
        self.config = hf_config
        self.shard, self.tp = shard, tp
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_layers = hf_config.num_hidden_layers
        self.num_q_heads = hf_config.num_attention_heads
        self.num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or self.num_q_heads
        self.hidden_size = hf_config.hidden_size
        self.head_dim = getattr(hf_config, "head_dim", None) or self.hidden_size // self.num_q_heads
        self.intermediate_size = hf_config.intermediate_size
        self.vocab_size = hf_config.vocab_size  # the whole vocabulary: the logits rank 0 gets
        self.vocab_local = self.vocab_size  # rows of embed/lm_head held here
        if shard is not None:
            self.num_q_heads, self.num_kv_heads = shard.num_q_heads, shard.num_kv_heads
            self.intermediate_size, self.vocab_local = shard.intermediate_size, shard.vocab_size
        self.eps = hf_config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_q_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        self._check_activation(hf_config)
        self.max_context = hf_config.max_position_embeddings
        # sliding window per layer, or None
        self.layer_windows = layer_windows(hf_config, self.num_layers)
        cos, sin = rope_tables(hf_config, self.head_dim, self.max_context)
        # the KV pool holds the model dtype, as in HF: in bf16 it and its gathers move half the
        # bytes, and decode attention runs in it (the CPU backend computes prompts in float32:
        # attention_torch.py)
        self.attn_dtype = dtype
        # RoPE itself runs in float32 on a CPU, so a bf16 query/key is rounded once, after the
        # rotation, not after each of its products and sums
        self.rope_dtype = torch.float32 if self.device.type == "cpu" else dtype
        # [max_context, D] each; rotate_half(x) * sin == cat(x2, x1) * cat(-sin, sin): store the
        # signed sin, skip the negation
        self.rope_cos = torch.cat((cos, cos), dim=-1).to(device=self.device, dtype=self.rope_dtype)
        self.rope_sin = torch.cat((-sin, sin), dim=-1).to(device=self.device, dtype=self.rope_dtype)
        self.layers: list[LayerWeights] = []
        self.eager_dims = self.layer_dims()
        self.embed: torch.Tensor | None = None
        self.final_norm: torch.Tensor | None = None
        self.lm_head: LogitsHead | None = None

    def load_weights(self, state_dict: dict[str, torch.Tensor], copies: bool = False) -> None:
        """Takes HF parameter names (model.layers.N.self_attn.q_proj.weight, ...); fuses as it goes
        (llama_weights.py). copies: also build every linear weight's integer forms
        (linear.IntCopies; the runner's weight plan picks which each step size reads); the state
        dict must then be float32, unrounded."""
        r = WeightReader(self.standard_names(state_dict), self.device, self.dtype, copies)
        s = WeightShapes(
            self.hidden_size,
            self.head_dim,
            self.num_q_heads,
            self.num_kv_heads,
            self.intermediate_size,
            self.vocab_local,
        )
        H = self.hidden_size
        self.embed = check_shape(
            "embed_tokens.weight", r.take("embed_tokens.weight"), (self.vocab_local, H)
        )
        self.final_norm = check_shape("norm.weight", r.take("norm.weight"), (H,)).float()
        tie = getattr(self.config, "tie_word_embeddings", False)
        self.lm_head = read_lm_head(r, self.embed, tie, s)
        self.layers = []
        for i in range(self.num_layers):
            self.layers.append(self._read_layer(r, i, s))
        r.check_all_used()

    def _check_activation(self, hf_config) -> None:
        """The MLP's activation is the family's (Llama's silu(gate) * up)."""
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(
                f"hidden_act {hf_config.hidden_act!r} is not supported (expected silu)"
            )

    def standard_names(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The checkpoint under Llama's parameter names (a family that fuses projections in its
        checkpoint splits them here; tensor parallel sharding reads these names too)."""
        return sd

    def _read_layer(self, r: WeightReader, i: int, s: WeightShapes) -> LayerWeights:
        return read_layer(r, i, s)

    def layer_dims(self, compiled: bool = False) -> LayerDims:
        return LayerDims(
            self.num_q_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
            self.eps,
            self.dtype,
            self.rope_dtype,
            self.attn_dtype,
            compiled,
        )

    def forward(
        self, fb: ForwardBatch, kv: KVCache, attn, graphs: Any = None, lora: Any = None
    ) -> torch.Tensor:
        """Logits [R, vocab] float32 for rows fb.logits_rows of the flat token axis. graphs: the
        compiled layer functions for this step's token count (compiled_layers.py), or None for
        eager. lora: the step's LoRA updates (model/lora_pool.LoraStep); such a step runs eager."""
        if lora is not None:
            graphs = None
        assert self.embed is not None, "load_weights first"
        if fb.attn_meta is None:
            attn.init_forward_metadata(fb)
        # [T, 1, D], shared by all layers
        rope = self._rope_rows(fb.positions)
        # the residual stream stays float32 whatever the weights' dtype: a bf16 model then rounds
        # only the matmul inputs and outputs (teacher-forced top-1 agreement with fp32
        # transformers 96.3% -> see tests/integration/test_default_dtype_quality.py), at no
        # measurable cost
        h = self._embed(fb.input_ids)  # [T, H] float32
        h, o = self._run_layers(h, rope, fb, kv, attn, graphs, lora)
        return self._logits(h, o, fb, graphs, lora)

    def _run_layers(
        self,
        h: torch.Tensor,
        rope: tuple,
        fb: ForwardBatch,
        kv: KVCache,
        attn,
        graphs: Any,
        lora: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer up to the last one's attention: (the residual stream, the last layer's
        attention output). Between two attentions one seam (feed-forward, then the next layer's
        q/k/v) runs, compiled or eager; layer by layer where the layers are not all alike (tensor
        parallelism's all-reduces, LoRA's updates, a model with its own feed-forward)."""
        layerwise = graphs is None and (self.tp is not None or lora is not None or self.layerwise)
        if graphs:
            q, k, v = graphs.attention_inputs(h, *self._attention_args(0, rope))
        else:
            q, k, v = self._attention_inputs(0, h, rope, lora)
        for i in range(self.num_layers):
            o = attn.forward(
                q,
                k,
                v,
                kv.k[i],
                kv.v[i],
                fb,
                self.scale,
                *kv.scales(i),
                **self._attention_kwargs(i),
            )  # [T, Hq, D]
            if i == self.num_layers - 1:
                break
            if layerwise:
                h = self._feed_forward(i, h, o, lora)
                q, k, v = self._attention_inputs(i + 1, h, rope, lora)
                continue
            step = graphs.seam if graphs else partial(llama_layer.seam, self.eager_dims)
            h, q, k, v = step(h, o, *self._ffn_args(i), *self._attention_args(i + 1, rope))
        return h, o

    def _attention_kwargs(self, i: int) -> dict:
        """What layer i's attention takes besides tensors: its sliding window."""
        return {"window": self.layer_windows[i]}

    def _rope_rows(self, positions: torch.Tensor) -> tuple:
        """The step's RoPE rows, cos and sin [T, 1, D], shared by all layers (a family with
        another table for some layers adds its rows: _attention_args picks a layer's pair)."""
        cos = self.rope_cos.index_select(0, positions)[:, None, :]
        return cos, self.rope_sin.index_select(0, positions)[:, None, :]

    def _attention_args(self, i: int, rope: tuple) -> tuple:
        layer = self.layers[i]
        return layer.input_norm, layer.qkv.op_args(), layer.qk_norm, rope[0], rope[1]

    def _ffn_args(self, i: int) -> tuple:
        layer = self.layers[i]
        return layer.o.op_args(), layer.post_norm, layer.gate_up.op_args(), layer.down.op_args()

    def _attention_inputs(self, i: int, h: torch.Tensor, rope: tuple, lora: Any) -> tuple:
        """Layer i's q, k, v, eager."""
        return llama_layer.attention_inputs(
            self.eager_dims, h, *self._attention_args(i, rope), lora=_layer_lora(lora, i)
        )

    def _feed_forward(self, i: int, h: torch.Tensor, o: torch.Tensor, lora: Any) -> torch.Tensor:
        """Layer i after its attention, eager: the new residual stream. Models whose feed-forward
        differs (mixture-of-experts) override this."""
        return llama_layer.feed_forward(
            self.eager_dims,
            h,
            o,
            *self._ffn_args(i),
            reduce=self._reduce,
            lora=_layer_lora(lora, i),
        )

    def _logits(
        self, h: torch.Tensor, o: torch.Tensor, fb: ForwardBatch, graphs: Any, lora: Any = None
    ) -> torch.Tensor:
        """The last layer's feed-forward, the final norm and the logits of rows fb.logits_rows
        (under vocab parallelism rank 0 gets every rank's slice, the others None)."""
        d, last = self.eager_dims, self.num_layers - 1
        if graphs:
            x = graphs.final(h, o, *self._ffn_args(last), self.final_norm)
        elif self.tp is not None or lora is not None or self.layerwise:
            x = llama_layer.norm(d, self._feed_forward(last, h, o, lora), self.final_norm)
        else:
            x = llama_layer.final(d, h, o, *self._ffn_args(last), self.final_norm)
        return self.head(x, fb)

    def head(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Logits of rows fb.logits_rows from the final-normed hidden rows x [T, H]."""
        if fb.logits_rows.shape[0] != fb.num_tokens:
            x = x.index_select(0, fb.logits_rows)
        logits = self.lm_head(x)
        if self.tp is not None:
            return self.tp.gather_last_dim(logits)
        return logits

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return F.embedding(ids, self.embed).float()
        # vocab parallel: each rank looks up the ids of its slice (zeros elsewhere), the ranks sum
        local = ids - self.shard.vocab_start
        here = (local >= 0) & (local < self.vocab_local)
        h = F.embedding(local.clamp(0, self.vocab_local - 1), self.embed).float() * here[:, None]
        return self.tp.all_reduce(h)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel layer's output: the sum over ranks (in float32, as the residual
        stream)."""
        if self.tp is None:
            return partial
        return self.tp.all_reduce(partial.float())


def _layer_lora(lora: Any, index: int) -> Any:
    """Layer index's LoRA updates in a forward with adapters (lora: its LoraStep), else None."""
    return None if lora is None else lora.layer(index)
