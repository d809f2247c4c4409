"""GGUF files in each quantisation type (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), written with the gguf
package from a tiny random Llama the way llama.cpp lays one out: radixrt serves them kept quantised
(the cache holds the file's blocks, not float32) and reads exactly the weights transformers reads
from the same file, so its logits equal transformers' model of that file."""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf_writer import write_gguf
from test_llama_tiny import build, hf_logits

from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.model import gguf_weights, weights
from radixrt.runtime.model.models.llama import LlamaForCausalLM

VOCAB = 768  # the default model's first tokens (gguf_writer cuts its tokenizer to them)
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def tiny_llama():
    """K-quants need rows of whole 256-wide super-blocks: hidden and intermediate sizes of 256."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    hf, _, _ = build(config, seed=11)
    return config, hf.state_dict()


@pytest.mark.parametrize("qtype", TYPES)
def test_each_quantisation_loads_as_transformers_reads_it(
    qtype, tiny_llama, tmp_path, monkeypatch, paged_driver
):
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.model.weights import default_gguf_path

    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))
    config, state = tiny_llama
    path = write_gguf(
        state, config, tmp_path / f"tiny-{qtype}.gguf", gguf.GGMLQuantizationType[qtype],
        default_gguf_path(),
    )  # fmt: skip
    model_dir = weights.resolve_model(str(path))
    # the cache keeps the file's blocks: no float32 copy of the matrices on disk
    cached = sum(f.stat().st_size for f in model_dir.iterdir())
    assert cached < 0.6 * sum(t.numel() * 4 for t in state.values()), cached
    assert gguf_weights.quantization_types(model_dir)[qtype] == 2 + 7 * config.num_hidden_layers
    hf = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    ).eval()
    ours_sd = weights.load_state_dict(model_dir, torch.float32)
    theirs = hf.state_dict()
    assert set(ours_sd) == set(theirs)
    for name, t in theirs.items():
        assert torch.equal(ours_sd[name], t), name
    ours = LlamaForCausalLM(weights.load_config(model_dir), torch.float32)
    ours.load_weights(ours_sd)
    ids = list(range(100, 160))
    attn = TorchAttentionBackend(ours.num_q_heads, ours.num_kv_heads, ours.head_dim)
    got = paged_driver(ours, attn, num_pages=32, page_size=4).step([("a", ids, True)])["a"]
    # the weights are equal; the two forwards round differently (a 256-wide model: 1e-4)
    torch.testing.assert_close(got, hf_logits(hf, ids), atol=1e-4, rtol=1e-5)
    # and the quantisation is the one asked for: far from the float32 weights, closer the wider
    err = theirs["model.layers.0.mlp.up_proj.weight"] - state["model.layers.0.mlp.up_proj.weight"]
    assert 0 < err.abs().max() < 0.2, (qtype, err.abs().max())


def family_config(kind: str):
    """Tiny configs of the dense families transformers reads from GGUF, in the values its GGUF
    reader assumes for what the file does not say (Qwen3's head_dim 128, Gemma's
    query_pre_attn_scalar 256 and soft caps 50 / 30)."""
    import transformers as tf

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    if kind == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=False)
    if kind == "qwen3":
        wide = {**common, "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
        return tf.Qwen3Config(**wide, head_dim=128, tie_word_embeddings=False)
    if kind == "phi3":
        return tf.Phi3Config(**common, tie_word_embeddings=False)
    cls = tf.Gemma2Config if kind == "gemma2" else tf.Gemma3TextConfig
    return cls(**common, head_dim=16, sliding_window=6, tie_word_embeddings=True)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "phi3", "gemma2", "gemma3"])
def test_dense_families_load_as_transformers_reads_them(kind, tmp_path, monkeypatch, paged_driver):
    """A Q8_0 GGUF of each family (gguf's tensor names; Phi-3's fused projections, Gemma's 1 + w
    norms as llama.cpp stores them): radixrt's weights and logits equal transformers' reading."""
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.model.models.registry import model_class
    from radixrt.runtime.model.weights import default_gguf_path

    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(tmp_path / "cache"))
    hf, _, _ = build(family_config(kind), seed=12)
    path = write_gguf(
        hf.state_dict(), hf.config, tmp_path / f"{kind}.gguf", gguf.GGMLQuantizationType.Q8_0,
        default_gguf_path(),
    )  # fmt: skip
    model_dir = weights.resolve_model(str(path))
    theirs = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    ).eval()
    config = weights.load_config(model_dir)
    ours = model_class(config)(config, torch.float32)
    ours.load_weights(weights.load_state_dict(model_dir, torch.float32))
    ids = list(range(100, 140))
    attn = TorchAttentionBackend(ours.num_q_heads, ours.num_kv_heads, ours.head_dim)
    got = paged_driver(ours, attn, num_pages=32, page_size=4).step([("a", ids, True)])["a"]
    torch.testing.assert_close(got, hf_logits(theirs, ids), atol=1e-4, rtol=1e-5)
