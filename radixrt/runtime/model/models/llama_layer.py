"""The dense math of one Llama-family layer, as pure functions of tensors: the same code runs eager
and inside torch.compile'd graphs (model/compiled_layers.py).

A layer is split at attention, which reads the paged pool and stays outside any graph:

    attention_inputs(h)  norm -> qkv -> (q/k norm) -> RoPE          -> q, k, v
    attention(q, k, v)   the attention backend (kernels/)
    feed_forward(h, o)   o_proj -> residual -> norm -> gate_up -> silu*up -> down -> residual -> h

`seam` is feed_forward of layer i followed by attention_inputs of layer i+1: one graph per call
between two attentions. Weights arrive as tuples of plain tensors (Linear.op_args), never as
objects, so a compiled graph takes them as inputs and one graph serves every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from radixrt.runtime.model.linear import linear_kernel, run_format

Reduce = Callable[[torch.Tensor], torch.Tensor]
# LoRA (model/lora_pool.LayerLora): lora(group, x, out) adds the adapters' updates of a group of
# projections reading input x ("qkv", "o", "gate_up", "down") to their fused output, in place
# (eager only)
Lora = Callable[[str, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class LayerDims:
    """What the layer functions need besides tensors (constants of a compiled graph)."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    dtype: torch.dtype  # weights and matmul inputs
    rope_dtype: torch.dtype  # RoPE's arithmetic
    attn_dtype: torch.dtype  # q/k/v as attention reads them
    # matmuls through torch.ops.radixrt.linear (graph-safe) instead of the kernel
    compiled: bool = False
    # the one weight format a compiled bucket's plan reads at every row count, when its kernel is
    # traced into the graph itself instead of behind torch.ops.radixrt.linear (which picks by rows
    # at run time, ~9 us of dispatch a call: ~1 ms of a one-row step's 120 matmuls): the 4-bit and
    # int8 weight-only kernels (ATen ops Inductor calls directly), and int8 with dynamically
    # quantised activations (its quantisation and rescale fused into the graph's loops)
    traced_format: int | None = None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Over the last dim; weight [..., dim] may carry leading dims (per-head norms stacked)."""
    if x.dtype == torch.float32:  # fused op; same value as HF's formula in float32
        if weight.dim() == 1:
            return F.rms_norm(x, weight.shape, weight, eps)
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    # HF: normalize in float32, round to the model dtype, then scale by the weight (the fused op in
    # float32 is HF's formula: 3 ops instead of 7, ~3 ms of a 16-row decode step on a 2-core CPU)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def norm(d: LayerDims, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of the float32 residual stream with a float32 weight, rounded once to the model
    dtype."""
    return F.rms_norm(h, weight.shape, weight, d.eps).to(d.dtype)


def linear(d: LayerDims, x: torch.Tensor, args: tuple) -> torch.Tensor:
    """x [T, K] times a Linear (its op_args) -> [T, N]."""
    if d.traced_format is not None:
        return run_format(d.traced_format, x, args)
    if d.compiled:
        return torch.ops.radixrt.linear(x, *args)
    return linear_kernel(x, *args)


def attention_inputs(
    d: LayerDims,
    h: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: tuple,
    qk_norm: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    lora: Lora | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [T, H] float32 -> q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D] in attn_dtype. cos/sin
    [T, 1, D] (sin signed: rotate_half(x) * sin == cat(x2, x1) * cat(-sin, sin)). qk_norm: Qwen3's
    per-head weights [Hq + Hkv, D], or OLMoE's whole-projection ones ([Hq * D], [Hkv * D])."""
    T, D, Hq, Hkv = h.shape[0], d.head_dim, d.num_q_heads, d.num_kv_heads
    x = norm(d, h, input_norm)
    out = linear(d, x, qkv)  # [T, (Hq + 2 Hkv) * D]
    if lora is not None:
        lora("qkv", x, out)
    qk = _normed_qk(d, out, qk_norm)
    qk = qk.to(d.rope_dtype)
    half = D // 2
    # RoPE on q and k at once: qk * cos + rotate_half(qk) * sin
    qk = torch.addcmul(qk * cos, torch.cat((qk[..., half:], qk[..., :half]), dim=-1), sin).to(
        d.attn_dtype
    )
    v = out[:, (Hq + Hkv) * D :].reshape(T, Hkv, D)
    return qk[:, :Hq], qk[:, Hq:], v


def _normed_qk(d: LayerDims, out: torch.Tensor, qk_norm) -> torch.Tensor:
    """q and k of the fused projection as [T, Hq + Hkv, D], normed where the model norms them."""
    T, D, Hq, Hkv = out.shape[0], d.head_dim, d.num_q_heads, d.num_kv_heads
    if isinstance(qk_norm, tuple):  # OLMoE: one norm over all of q, one over all of k
        q_w, k_w = qk_norm
        q = rms_norm(out[:, : Hq * D], q_w, d.eps)
        k = rms_norm(out[:, Hq * D : (Hq + Hkv) * D], k_w, d.eps)
        return torch.cat((q, k), dim=1).reshape(T, Hq + Hkv, D)
    qk = out[:, : (Hq + Hkv) * D].reshape(T, Hq + Hkv, D)
    return qk if qk_norm is None else rms_norm(qk, qk_norm, d.eps)  # Qwen3: per head


def feed_forward(
    d: LayerDims,
    h: torch.Tensor,
    o: torch.Tensor,
    o_proj: tuple,
    post_norm: torch.Tensor,
    gate_up: tuple,
    down: tuple,
    reduce: Reduce | None = None,
    lora: Lora | None = None,
) -> torch.Tensor:
    """The rest of the layer after attention: o [T, Hq, D] -> the new residual stream [T, H]
    float32. reduce: tensor parallelism's all-reduce of a row-parallel output (eager only)."""
    T, I = h.shape[0], d.intermediate_size
    o_in = o.reshape(T, d.num_q_heads * d.head_dim).to(d.dtype)
    attn_out = linear(d, o_in, o_proj)
    if lora is not None:
        lora("o", o_in, attn_out)
    h = h + (reduce(attn_out) if reduce else attn_out)
    x = norm(d, h, post_norm)
    gu = linear(d, x, gate_up)  # [T, 2I]
    if lora is not None:
        lora("gate_up", x, gu)
    act = F.silu(gu[:, :I]) * gu[:, I:]
    mlp_out = linear(d, act, down)
    if lora is not None:
        lora("down", act, mlp_out)
    return h + (reduce(mlp_out) if reduce else mlp_out)


def seam(
    d: LayerDims,
    h: torch.Tensor,
    o: torch.Tensor,
    o_proj: tuple,
    post_norm: torch.Tensor,
    gate_up: tuple,
    down: tuple,
    input_norm: torch.Tensor,
    qkv: tuple,
    qk_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """feed_forward of one layer, then attention_inputs of the next: (h, q, k, v)."""
    h = feed_forward(d, h, o, o_proj, post_norm, gate_up, down)
    return (h, *attention_inputs(d, h, input_norm, qkv, qk_norm, cos, sin))


def final(
    d: LayerDims,
    h: torch.Tensor,
    o: torch.Tensor,
    o_proj: tuple,
    post_norm: torch.Tensor,
    gate_up: tuple,
    down: tuple,
    final_norm: torch.Tensor,
) -> torch.Tensor:
    """feed_forward of the last layer, then the final norm: [T, H] in the model dtype."""
    return norm(d, feed_forward(d, h, o, o_proj, post_norm, gate_up, down), final_norm)
