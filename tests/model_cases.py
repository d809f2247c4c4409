"""Tiny random configs (transformers' own classes) of the families beyond Llama, shared by the unit
and integration tests: mixture-of-experts (tiny_moe_config), Phi-3 and Gemma 2/3
(dense_family_config)."""

from __future__ import annotations

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


MOE_KINDS = [
    "mixtral_sliding",
    "qwen2_moe_shared_dense_layer",
    "qwen2_moe_sparse_step_sliding",
    "qwen3_moe",
    "olmoe",
]


def tiny_moe_config(kind: str):
    import transformers as tf

    if kind == "mixtral_sliding":  # every layer attends to its last 8 positions
        return tf.MixtralConfig(
            **COMMON, intermediate_size=48, num_hidden_layers=2, num_local_experts=6,
            num_experts_per_tok=2, sliding_window=8,
        )  # fmt: skip
    if kind == "qwen2_moe_shared_dense_layer":  # layer 1 dense; top-k not renormalised
        return tf.Qwen2MoeConfig(
            **COMMON, intermediate_size=80, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_hidden_layers=3, num_experts=8,
            num_experts_per_tok=3, mlp_only_layers=[1], norm_topk_prob=False,
        )  # fmt: skip
    if kind == "qwen2_moe_sparse_step_sliding":  # layers 1 and 3 sparse; a window of 6 on layer 0
        config = tf.Qwen2MoeConfig(
            **COMMON, intermediate_size=80, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_hidden_layers=4, num_experts=4,
            num_experts_per_tok=2, decoder_sparse_step=2, norm_topk_prob=True,
            use_sliding_window=True, sliding_window=6, max_window_layers=1,
        )  # fmt: skip
        assert config.layer_types[0] == "sliding_attention", config.layer_types
        return config
    if kind == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **{**COMMON, "num_attention_heads": 6}, head_dim=16, intermediate_size=80,
            moe_intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True,
        )  # fmt: skip
    if kind == "olmoe":  # whole-projection q/k norms, top-k not renormalised
        return tf.OlmoeConfig(
            **COMMON, intermediate_size=32, num_hidden_layers=2, num_experts=8,
            num_experts_per_tok=2,
        )  # fmt: skip
    raise AssertionError(kind)


def dense_family_config(kind: str, common: dict = COMMON):
    """Phi-3 with its fused projections and a window of 7; Gemma with sliding (window 6) and global
    layers, scores and logits capped low enough to matter, Gemma 3 with linear-scaled RoPE on its
    global layers and a base of its own on the sliding ones."""
    import transformers as tf

    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common = {**common, "tie_word_embeddings": False, "intermediate_size": 128}
    if kind == "phi3_fused_sliding":
        return tf.Phi3Config(**{"num_hidden_layers": 2, **common}, sliding_window=7, **ids)
    gemma = dict(
        common, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        **ids,
    )  # fmt: skip
    if kind == "gemma2_softcapped":
        return tf.Gemma2Config(**gemma, attn_logit_softcapping=1.5, final_logit_softcapping=2.5)
    if kind == "gemma3_local_rope":
        rope = {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        }
        return tf.Gemma3TextConfig(**gemma, rope_parameters=rope)
    raise AssertionError(kind)


def randomize(model, std: float) -> None:
    """Weights well away from their init values (norms in 0.5..1.5, the rest N(0, std)): biases
    and norms matter, logits and routers are peaked, so greedy picks sit far from ties."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, std)


def save_random_model(config, tokenizer, out_dir, seed: int = 0, max_positions: int = 512):
    """A random model of config with the tokenizer's vocabulary and special ids, saved with
    transformers and that tokenizer beside it; returns the model (float32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    config.vocab_size, config.max_position_embeddings = len(tokenizer), max_positions
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, 0.3)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return model.eval()
