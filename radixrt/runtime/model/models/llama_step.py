"""A whole decode step of a Llama-family model as one pure function of tensors: the embedding, every
layer with its attention over the paged pool, and the final norm. model/step_graph.py compiles it
per bucket (the CPU's analogue of a CUDA graph); the eager forward (llama.py) computes the same.

Attention reads the pool in place and never writes it: each request's scores and weighted values
are reductions whose loads index the pool through kv_idx (paged_attention: Inductor fuses the
indexing into the loops, so no layer gathers a copy of its pages; 1.3-2x faster than a gather, the
newest key put in, and the CPU flash kernel, at 1-32 rows and 560-2,048 keys on a 2-core Zen 4:
benchmarks/bench_paged_attention.py), and the newest token's key and value, not yet in the pool,
are attended to beside them (where the eager path writes the pool first and then gathers the same
slots). The graph returns the new keys and values of every layer, which the caller writes into the
pool after it (two index copies). So the graph mutates none of its inputs: a mutated input makes
Inductor copy it back whole.

The layout is the torch backend's decode group (kernels/attention_torch_plan.DecodeMeta): one row
per request, its own positions kv_idx [B, L] (padding masked), and, for the cascade, the slots of a
prefix every request shares, attended to once for the whole batch and merged by log-sum-exp.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

from radixrt.kernels.attention_math import merge
from radixrt.runtime.model.layer_tracing import flatten
from radixrt.runtime.model.models import llama_layer
from radixrt.runtime.model.models.llama_layer import LayerDims

# one layer's weights: (input_norm, qkv, qk_norm, o, post_norm, gate_up, down), Linears as op_args
LayerArgs = tuple


def decode_step(
    d: LayerDims,
    scale: float,
    regions: bool,
    ids: torch.Tensor,
    positions: torch.Tensor,
    kv_idx: torch.Tensor,
    own_lens: torch.Tensor,
    shared_idx: torch.Tensor | None,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    embed: torch.Tensor,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    final_norm: torch.Tensor,
    layers: tuple[LayerArgs, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids/positions [B]: one new token per request. kv_idx [B, L]: pool slots of each request's
    own positions (after the shared prefix), its newest (this token's) at column own_lens - 1, the
    rest masked. shared_idx [S] or None: the shared prefix's slots. k_pool/v_pool [layers, slots,
    Hkv, D]. -> (the final-normed hidden rows [B, H] in the model dtype, the new keys and values
    [layers, B, Hkv, D])."""
    num_reqs, kv_len = kv_idx.shape
    h = F.embedding(ids, embed).float()
    cos = rope_cos.index_select(0, positions)[:, None, :]
    sin = rope_sin.index_select(0, positions)[:, None, :]
    # the pool's columns a request reads: its own positions before the newest (not in the pool yet)
    visible = torch.arange(kv_len, device=kv_idx.device)[None, :] < own_lens[:, None] - 1
    q, k, v = llama_layer.attention_inputs(d, h, *_attention_args(layers[0], cos, sin))
    if regions:  # every call of a region takes its inputs in one layout: the layers' own copies
        q, k, v = _copies(q, k, v)
    new_k, new_v = [], []
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        new_k.append(k)
        new_v.append(v)
        pools = (k_pool[i], v_pool[i])
        step = (h, q, k, v, *pools, kv_idx, visible, shared_idx, layer[3:])
        if i == last:
            x = _region(regions, partial(_last_layer, d, scale), "last", (*step, final_norm))
            return x, torch.stack(new_k), torch.stack(new_v)
        nxt = _attention_args(layers[i + 1], cos, sin)
        h, q, k, v = _region(regions, partial(_layer, d, scale), "layer", (*step, nxt))
    raise ValueError("a model has at least one layer")


def _region(regions: bool, fn, name: str, args: tuple):
    """fn(*args); with regions, traced as one region that Inductor compiles once however many
    layers call it (torch's invoke_subgraph); the constants of args (absent biases, the weight plan)
    are part of the region's identity."""
    if regions:
        flat, rebuild = flatten(args)
        skeleton = rebuild(list(range(len(flat))))
        out = invoke_subgraph(lambda *t: fn(*rebuild(list(t))), f"{name}{skeleton}", *flat)
    else:
        out = fn(*args)
    return out[0] if len(out) == 1 else tuple(out)


def _layer_attention(d, scale, q, k, v, k_pool, v_pool, kv_idx, visible, shared_idx):
    out, lse = paged_attention(d, scale, q, k, v, k_pool, v_pool, kv_idx, visible)
    if shared_idx is None:
        o = out.to(q.dtype)
    else:
        o = _attend_cascade(d, scale, q, out.to(q.dtype), lse, k_pool, v_pool, shared_idx)
    return o.reshape(q.shape[0], d.num_q_heads, d.head_dim)


def _layer(d, scale, h, q, k, v, k_pool, v_pool, kv_idx, visible, shared_idx, ffn, nxt):
    """One layer's attention and feed-forward, then the next layer's q/k/v: (h, q, k, v)."""
    o = _layer_attention(d, scale, q, k, v, k_pool, v_pool, kv_idx, visible, shared_idx)
    h, q, k, v = llama_layer.seam(d, h, o, *ffn, *nxt)
    return h, *_copies(q, k, v)


def _copies(*views: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q/k/v are views of one buffer: as a region's outputs Inductor gives them wrong offsets, so
    each leaves as its own contiguous copy (a copy traced as such, fused into its producer)."""
    return tuple(t.clone(memory_format=torch.contiguous_format) for t in views)


def _last_layer(d, scale, h, q, k, v, k_pool, v_pool, kv_idx, visible, shared_idx, ffn, final_norm):
    o = _layer_attention(d, scale, q, k, v, k_pool, v_pool, kv_idx, visible, shared_idx)
    return (llama_layer.final(d, h, o, *ffn, final_norm),)


def _attention_args(layer: LayerArgs, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    return (*layer[:3], cos, sin)


def _grouped(d: LayerDims, q: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hkv, G, D]: the G q heads sharing a kv head as its query rows (the torch
    backend's decode layout: no K/V repeat)."""
    return q.reshape(q.shape[0], d.num_kv_heads, d.num_q_heads // d.num_kv_heads, d.head_dim)


def paged_attention(d: LayerDims, scale: float, q, k, v, k_pool, v_pool, kv_idx, visible):
    """Each request's query rows against its own keys: the pool's at kv_idx where visible, and its
    newest k/v [B, Hkv, D] -> (out [B, Hkv, G, D] float32, its log-sum-exp [B, Hkv, G]). Written as
    broadcast products and sums, not matmuls over a gathered copy: Inductor turns each into one
    loop whose loads index the pool (a gather it never materialises); float32 throughout."""
    qg = _grouped(d, q).float()  # [B, Hkv, G, D]
    keys = k_pool[kv_idx].float()  # [B, L, Hkv, D]: indexed loads inside the next reduction
    scores = (qg[:, None] * keys[:, :, :, None, :]).sum(-1) * scale  # [B, L, Hkv, G]
    scores = scores.masked_fill(~visible[:, :, None, None], float("-inf"))
    newest = (qg * k.float()[:, :, None, :]).sum(-1) * scale  # [B, Hkv, G]
    top = torch.maximum(scores.amax(1), newest)
    p, p_new = torch.exp(scores - top[:, None]), torch.exp(newest - top)
    total = p.sum(1) + p_new
    values = v_pool[kv_idx].float()  # [B, L, Hkv, D]
    out = (p[..., None] * values[:, :, :, None, :]).sum(1) + p_new[..., None] * v.float()[
        :, :, None
    ]
    return out / total[..., None], top + torch.log(total)


def _attend_cascade(d: LayerDims, scale: float, q, out_own, lse_own, k_pool, v_pool, shared_idx):
    """The request's own attention (paged_attention's), and all query rows of the batch at once
    against the shared prefix (unmasked: it precedes every new token), merged by log-sum-exp ->
    [B, Hkv, G, D]."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    n, hkv, g = q.shape[0], d.num_kv_heads, d.num_q_heads // d.num_kv_heads
    shared_k = k_pool.index_select(0, shared_idx)[None].transpose(1, 2)  # [1, Hkv, S, D]
    shared_v = v_pool.index_select(0, shared_idx)[None].transpose(1, 2)
    # the batch's query rows of a kv head as one long query: each shared K/V block packed once
    rows = _grouped(d, q).transpose(0, 1).reshape(1, hkv, n * g, d.head_dim)
    out, lse = flash(rows, shared_k, shared_v, 0.0, False, scale=scale)[:2]
    out = out.view(hkv, n, g, d.head_dim).transpose(0, 1)
    merged = merge(out_own, lse_own, out, lse.view(hkv, n, g).transpose(0, 1))
    # a copy traced as such (fused into the merge): the flash kernel's output strides differ
    # between this trace and Inductor's, and a reshape traced as a view fails on the other's
    return merged.clone(memory_format=torch.contiguous_format)
