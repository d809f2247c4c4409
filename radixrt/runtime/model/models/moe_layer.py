"""A mixture-of-experts feed-forward as pure functions of tensors (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE), formulas as transformers computes them so fp32 output matches it.

    route    router logits -> softmax (float32) -> top-k experts per token -> weights, renormalised
             over the k where the config says so
    experts  the (token, expert) pairs sorted by expert, so each expert multiplies all of its rows
             in one gate_up and one down matmul; experts no token chose cost nothing. No per-token
             loop and no dense all-experts product: the work is k rows per token.
    shared   Qwen2-MoE's shared expert, scaled by a sigmoid gate, added to every token

On a GPU the same grouping feeds one Triton launch per matmul (kernels/moe_triton.py); the
functions here are the CPU path and its reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixrt.runtime.model.linear import Linear


@dataclass
class MoeWeights:
    """One layer's experts. gate_up [E, 2 I, H] (gate rows first), down [E, H, I]."""

    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor
    down: torch.Tensor
    top_k: int
    renormalize: bool  # the top-k weights divided by their sum (Mixtral, norm_topk_prob)
    shared_gate_up: Linear | None = None  # Qwen2-MoE's shared expert [2 Is, H]
    shared_down: Linear | None = None  # [H, Is]
    shared_gate: torch.Tensor | None = None  # [1, H]: sigmoid(x . w) scales the shared expert

    @property
    def num_experts(self) -> int:
        return self.router.shape[0]


def route(x: torch.Tensor, w: MoeWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
    probs = torch.softmax(F.linear(x, w.router).float(), dim=-1)
    top, ids = torch.topk(probs, w.top_k, dim=-1)
    if w.renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(x.dtype), ids


def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w: MoeWeights):
    """The weighted sum of each token's chosen experts: [T, H] in x's dtype."""
    T, k = ids.shape
    inter = w.down.shape[2]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=w.num_experts).tolist()  # the step's one sync
    tokens = torch.div(order, k, rounding_mode="floor")
    rows = x.index_select(0, tokens)
    out = torch.empty_like(rows)
    start = 0
    for e, n in enumerate(counts):
        if n:
            gu = F.linear(rows[start : start + n], w.gate_up[e])
            out[start : start + n] = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], w.down[e])
            start += n
    out *= weights.reshape(-1).index_select(0, order)[:, None]
    # index_add_ walks the rows in order: each token sums its experts in expert order, as HF does
    return torch.zeros_like(x).index_add_(0, tokens, out)


def feed_forward(x: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    """The layer's MoE output for the normed input x [T, H] (model dtype): [T, H]."""
    weights, ids = route(x, w)
    if x.is_cuda:
        from radixrt.kernels.moe_triton import fused_experts

        out = fused_experts(x, weights, ids, w.gate_up, w.down)
    else:
        out = experts(x, weights, ids, w)
    if w.shared_gate_up is not None:
        gu = w.shared_gate_up(x)
        inter = gu.shape[1] // 2
        shared = w.shared_down(F.silu(gu[:, :inter]) * gu[:, inter:])
        out = out + torch.sigmoid(F.linear(x, w.shared_gate)) * shared
    return out
