"""Megatron sharding of a Llama-family checkpoint for one tensor parallel rank, done on HF names
before the model fuses q/k/v and gate/up (so each rank fuses its own slices).

- q, k, v and gate, up: column parallel (this rank's output rows: its query heads, its KV heads, its
  slice of the intermediate size); Qwen2's q/k/v biases follow their rows.
- o_proj and down_proj: row parallel (this rank's input columns); the model sums the ranks' outputs
  with one all-reduce each, so a bias (Llama's attention_bias) is added by rank 0 only.
- KV heads are split across ranks when they divide evenly, else (fewer KV heads than ranks) each KV
  head is replicated on the tp_size / num_kv_heads ranks whose query heads use it.
- embed_tokens and lm_head: vocab parallel (rows of this rank's vocabulary slice; the model masks
  the embedding lookup and gathers the logits). Qwen3's q/k norms are per head_dim and stay whole.
- Mixture-of-experts: every expert (and Qwen2-MoE's shared expert) is split along its own
  intermediate size like a dense MLP (gate/up or w1/w3 column parallel, down or w2 row parallel),
  so each rank holds a slice of every expert; the router and the shared expert's gate stay whole,
  so all ranks route alike and the expert outputs sum over ranks in the one all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    rank: int
    size: int
    num_q_heads: int  # this rank's
    num_kv_heads: int  # this rank's (1 when replicated)
    kv_head_start: int
    intermediate_size: int
    vocab_start: int
    vocab_size: int  # this rank's slice


def plan_shard(hf_config, rank: int, size: int) -> Shard:
    hq = hf_config.num_attention_heads
    hkv = getattr(hf_config, "num_key_value_heads", None) or hq
    inter, vocab = hf_config.intermediate_size, hf_config.vocab_size
    for name, n in (
        ("num_attention_heads", hq),
        ("intermediate_size", inter),
        ("vocab_size", vocab),
    ):
        if n % size:
            raise ValueError(f"tp_size {size} does not divide {name} {n}")
    if hkv % size == 0:
        local_kv, kv_start = hkv // size, rank * (hkv // size)
    elif size % hkv == 0:
        local_kv, kv_start = (
            1,
            rank // (size // hkv),
        )  # replicated: ranks that share a KV head hold a copy
    else:
        raise ValueError(f"tp_size {size} and num_key_value_heads {hkv}: neither divides the other")
    return Shard(
        rank,
        size,
        hq // size,
        local_kv,
        kv_start,
        inter // size,
        rank * (vocab // size),
        vocab // size,
    )


# the gated MLPs' projections, dense or expert (Mixtral's w1 = gate, w3 = up, w2 = down)
COLUMN_PARALLEL_MLP = ("gate_proj.weight", "up_proj.weight", ".w1.weight", ".w3.weight")
ROW_PARALLEL_MLP = ("down_proj.weight", ".w2.weight", "experts.down_proj")


def _own_slice(name: str, t: torch.Tensor, dim: int, shard: Shard) -> torch.Tensor:
    """This rank's 1/size of t along dim (an MLP's intermediate axis, whatever its size)."""
    n = t.shape[dim]
    if n % shard.size:
        raise ValueError(f"tp_size {shard.size} does not divide {name}'s intermediate size {n}")
    part = n // shard.size
    return t.narrow(dim, shard.rank * part, part)


def shard_state_dict(
    sd: dict[str, torch.Tensor], hf_config, shard: Shard
) -> dict[str, torch.Tensor]:
    """This rank's slices of an HF state dict (names kept; the model's shape checks use the local
    sizes)."""
    d = (
        getattr(hf_config, "head_dim", None)
        or hf_config.hidden_size // hf_config.num_attention_heads
    )
    q0, q1 = shard.rank * shard.num_q_heads * d, (shard.rank + 1) * shard.num_q_heads * d
    k0, k1 = shard.kv_head_start * d, (shard.kv_head_start + shard.num_kv_heads) * d
    v0, v1 = shard.vocab_start, shard.vocab_start + shard.vocab_size
    out = {}
    for name, t in sd.items():
        base = name.removeprefix("model.")
        if base.endswith(("q_proj.weight", "q_proj.bias")):
            t = t[q0:q1]
        elif base.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            t = t[k0:k1]
        elif base.endswith("o_proj.weight"):
            t = t[:, q0:q1]
        elif base.endswith("o_proj.bias"):
            if shard.rank:
                continue  # the all-reduce would add it size times
        elif base.endswith(COLUMN_PARALLEL_MLP):
            t = _own_slice(name, t, 0, shard)
        elif base.endswith(ROW_PARALLEL_MLP):
            t = _own_slice(name, t, t.dim() - 1, shard)
        elif base.endswith("experts.gate_up_proj"):  # transformers 5's stacked [E, 2 I, H]
            gate, up = t.chunk(2, dim=1)
            t = torch.cat([_own_slice(name, x, 1, shard) for x in (gate, up)], dim=1)
        elif base in ("embed_tokens.weight", "lm_head.weight"):
            t = t[v0:v1]
        out[name] = t.contiguous()
    return out
