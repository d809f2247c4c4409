"""Reading a Hugging Face Llama-family checkpoint into the tensors the forward uses.

HF parameter names (model.layers.N.self_attn.q_proj.weight, ...) map onto fused weights: q/k/v
into one qkv Linear, gate/up into one gate_up, Qwen3's per-head q/k norms stacked into one tensor.
Each weight's shape is checked, a missing or a left-over weight is an error naming it, and with
copies every linear weight also gets its integer forms (linear.IntCopies: int4 where exact, int8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixrt.runtime.model.linear import IntCopies, Linear
from radixrt.runtime.model.logits_head import LogitsHead


@dataclass
class LayerWeights:
    """One decoder layer's weights, fused for the forward."""

    input_norm: torch.Tensor  # [H]
    qkv: Linear  # [(Hq + 2 Hkv) * D, H], Qwen2 bias
    # [Hq + Hkv, D] Qwen3 per-head q/k norm weights, stacked; OLMoE's ([Hq * D], [Hkv * D])
    qk_norm: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None
    o: Linear  # [H, Hq * D], Llama attention_bias
    post_norm: torch.Tensor  # [H]
    gate_up: Linear | None  # [2 I, H]; None in a mixture-of-experts layer
    down: Linear | None  # [H, I]
    moe: Any = None  # a mixture-of-experts layer's experts (moe_layer.MoeWeights)


@dataclass(frozen=True)
class WeightShapes:
    """The sizes the checkpoint's tensors must have (this rank's, under tensor parallelism)."""

    hidden: int  # H
    head_dim: int  # D
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    intermediate: int  # I
    vocab: int  # rows of embed / lm_head


class WeightReader:
    """A state dict's tensors by HF name ("model." dropped), moved to the model's device and dtype
    as they are taken; what was never taken is reported by check_all_used."""

    def __init__(
        self,
        state_dict: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        copies: bool,
    ):
        self.sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
        self.used: set[str] = set()
        self.device, self.dtype, self.copies = device, dtype, copies

    def take(self, name: str, required: bool = True) -> torch.Tensor | None:
        if name not in self.sd:
            if required:
                raise ValueError(f"weight {name!r} missing from the checkpoint")
            return None
        self.used.add(name)
        return self.sd[name].to(device=self.device, dtype=self.dtype)

    def int_copies(self, *names: str) -> IntCopies | None:
        """The integer forms of these weights stacked (None unless reading with copies)."""
        return IntCopies.of(torch.cat([self.sd[n] for n in names])) if self.copies else None

    def check_all_used(self) -> None:
        """Refuse weights nothing took (an architecture this reader does not know)."""
        unused = sorted(
            set(self.sd)
            - self.used
            - {"lm_head.weight"}
            - {n for n in self.sd if n.endswith("rotary_emb.inv_freq")}
        )
        if unused:
            raise ValueError(
                f"unexpected weights in the checkpoint (unsupported architecture?): {unused[:5]}"
            )


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise ValueError(f"weight {name!r} has shape {tuple(t.shape)}, expected {shape}")
    return t


def read_lm_head(
    r: WeightReader, embed: torch.Tensor, tie_word_embeddings: bool, s: WeightShapes
) -> LogitsHead:
    """The output projection: lm_head.weight, or the embedding when tied (or lm_head is absent)."""
    lm_head = r.take("lm_head.weight", required=False)
    tied = tie_word_embeddings or lm_head is None
    return LogitsHead(
        embed if tied else check_shape("lm_head.weight", lm_head, (s.vocab, s.hidden)),
        copies=r.int_copies("embed_tokens.weight" if tied else "lm_head.weight"),
    )


def read_layer(r: WeightReader, i: int, s: WeightShapes, dense: bool = True) -> LayerWeights:
    """Layer i's weights, fused (taken in a fixed order, so the first fault found is named).
    dense False: a mixture-of-experts layer, whose feed-forward the model reads itself."""
    H, D, Hq = s.hidden, s.head_dim, s.num_q_heads
    p = f"layers.{i}."
    attn = p + "self_attn."
    qkv_w, qkv_b, qk_norm = _read_qkv(r, i, attn, s)
    return LayerWeights(
        input_norm=check_shape(
            p + "input_layernorm", r.take(p + "input_layernorm.weight"), (H,)
        ).float(),
        qkv=Linear(qkv_w, qkv_b, copies=r.int_copies(*(attn + n + "_proj.weight" for n in "qkv"))),
        qk_norm=qk_norm,
        o=Linear(
            check_shape(attn + "o_proj", r.take(attn + "o_proj.weight"), (H, Hq * D)),
            r.take(attn + "o_proj.bias", required=False),  # Llama attention_bias=True
            copies=r.int_copies(attn + "o_proj.weight"),
        ),
        post_norm=check_shape(
            p + "post_attention_layernorm", r.take(p + "post_attention_layernorm.weight"), (H,)
        ).float(),
        **(
            read_mlp(r, p + "mlp.", H, s.intermediate) if dense else {"gate_up": None, "down": None}
        ),
    )


def read_mlp(r: WeightReader, mlp: str, H: int, I: int) -> dict[str, Linear]:
    """A gated MLP's gate_proj/up_proj (fused) and down_proj under prefix mlp."""
    gate, up = r.take(mlp + "gate_proj.weight"), r.take(mlp + "up_proj.weight")
    return {
        "gate_up": Linear(
            check_shape(mlp + "gate_up", torch.cat((gate, up), dim=0), (2 * I, H)),
            copies=r.int_copies(mlp + "gate_proj.weight", mlp + "up_proj.weight"),
        ),
        "down": Linear(
            check_shape(mlp + "down_proj", r.take(mlp + "down_proj.weight"), (H, I)),
            copies=r.int_copies(mlp + "down_proj.weight"),
        ),
    }


def _read_qkv(
    r: WeightReader, i: int, attn: str, s: WeightShapes
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Layer i's fused q/k/v weight, its bias (Qwen2; all three or none) and its q/k norm weights:
    Qwen3's per head, stacked, or OLMoE's over each whole projection (None when absent)."""
    H, D, Hq, Hkv = s.hidden, s.head_dim, s.num_q_heads, s.num_kv_heads
    q, k, v = (r.take(attn + n + "_proj.weight") for n in "qkv")
    qkv_w = check_shape(attn + "qkv", torch.cat((q, k, v), dim=0), ((Hq + 2 * Hkv) * D, H))
    biases = [r.take(attn + n + "_proj.bias", required=False) for n in "qkv"]
    if any(b is not None for b in biases) and not all(b is not None for b in biases):
        raise ValueError(f"layer {i}: q/k/v biases must be all present or all absent")
    qkv_b = torch.cat(biases) if biases[0] is not None else None
    q_norm = r.take(attn + "q_norm.weight", required=False)
    k_norm = r.take(attn + "k_norm.weight", False)
    if q_norm is None or k_norm is None:
        return qkv_w, qkv_b, None
    if q_norm.shape == (Hq * D,) and Hq > 1:  # OLMoE
        k_norm = check_shape(attn + "k_norm", k_norm, (Hkv * D,))
        return qkv_w, qkv_b, (q_norm, k_norm)
    check_shape(attn + "q_norm", q_norm, (D,))
    check_shape(attn + "k_norm", k_norm, (D,))
    return qkv_w, qkv_b, torch.cat((q_norm.expand(Hq, D), k_norm.expand(Hkv, D))).contiguous()
