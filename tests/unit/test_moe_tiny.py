"""The mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the grouped expert
product vs a per-token loop, checkpoints as saved (one tensor per expert) vs transformers, and the
refusals. Their per-row logits vs transformers (sliding windows shorter than the sequences, Qwen's
dense layers beside sparse ones) run with every family in test_llama_tiny.py."""

from __future__ import annotations

import pytest
import torch
from model_cases import COMMON, MOE_KINDS, tiny_moe_config
from test_llama_tiny import ATOL, RTOL, build, hf_logits

from radixrt.runtime.model.models import moe_layer
from radixrt.runtime.model.models.registry import model_class


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_each_family_is_its_own_class_with_experts(kind):
    """Its per-row logits against transformers run with the dense families in test_llama_tiny.py
    (prefill, chunks over a cached prefix, mixed decode/extend batches, page sizes 1/4/16)."""
    _, ours, _ = build(tiny_moe_config(kind))
    assert type(ours).__name__.lower().startswith(kind.split("_")[0])
    assert any(layer.moe is not None for layer in ours.layers)


def test_tokens_are_grouped_by_expert_and_match_a_per_token_loop():
    """The grouped expert product equals the naive sum over each token's chosen experts, and a
    token's experts are the top-k of its router probabilities."""
    gen = torch.Generator().manual_seed(0)
    E, H, I, T = 5, 16, 8, 23
    w = moe_layer.MoeWeights(
        router=torch.randn(E, H, generator=gen),
        gate_up=torch.randn(E, 2 * I, H, generator=gen) * 0.3,
        down=torch.randn(E, H, I, generator=gen) * 0.3,
        top_k=2,
        renormalize=True,
    )
    x = torch.randn(T, H, generator=gen)
    weights, ids = moe_layer.route(x, w)
    probs = torch.softmax(x @ w.router.T, dim=-1)
    assert torch.equal(ids.sort(-1).values, probs.topk(2, -1).indices.sort(-1).values)
    torch.testing.assert_close(weights.sum(-1), torch.ones(T))
    assert len(set(ids.flatten().tolist())) == E  # the test covers every expert
    naive = torch.zeros(T, H)
    for t in range(T):
        for j in range(2):
            e = ids[t, j]
            gu = w.gate_up[e] @ x[t]
            naive[t] += weights[t, j] * (w.down[e] @ (torch.nn.functional.silu(gu[:I]) * gu[I:]))
    torch.testing.assert_close(moe_layer.experts(x, weights, ids, w), naive)


@pytest.mark.parametrize("kind", ["mixtral_sliding", "qwen2_moe_shared_dense_layer"])
def test_checkpoint_layout_loads_as_the_in_memory_one(kind, tmp_path, paged_driver):
    """A saved checkpoint keeps one tensor per expert projection (Mixtral's under
    block_sparse_moe, w1/w3/w2); loaded from it the model gives HF's logits, and a missing expert
    is refused by name."""
    from radixrt.runtime.model.weights import load_state_dict

    config = tiny_moe_config(kind)
    hf, _, attn = build(config)
    hf.save_pretrained(tmp_path)
    sd = load_state_dict(tmp_path)
    assert any(".experts.3." in k for k in sd), sorted(sd)[:8]
    ours = model_class(config)(config)
    ours.load_weights(sd)
    ids = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(8)).tolist()
    got = paged_driver(ours, attn, num_pages=40, page_size=4).step([("a", ids, True)])["a"]
    torch.testing.assert_close(got, hf_logits(hf, ids), atol=ATOL, rtol=RTOL)
    gone = next(k for k in sd if ".experts.3." in k and (".w2." in k or "down_proj" in k))
    with pytest.raises(ValueError, match=gone.removeprefix("model.").replace(".", r"\.")):
        model_class(config)(config).load_weights({k: v for k, v in sd.items() if k != gone})


def test_unknown_architectures_and_moe_refusals_name_the_problem():
    from transformers import MixtralConfig

    from radixrt.runtime.model.models.registry import architecture_of

    with pytest.raises(ValueError, match="GPT2LMHeadModel is not supported"):
        architecture_of({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    assert architecture_of({"model_type": "qwen3_moe"}) == "Qwen3MoeForCausalLM"
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        bad = MixtralConfig(**{**COMMON}, num_local_experts=2, num_experts_per_tok=3)
        model_class(bad)(bad)
