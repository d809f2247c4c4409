"""Writing a GGUF file from a transformers model the way llama.cpp's converter lays it out (Llama's
q/k rows permuted for its RoPE, Gemma's norms stored as 1 + w, norms in F32, every matrix in one
quantisation type, gguf's own tensor names), with the default model's tokenizer metadata copied in.
Tests and the quality benchmark use it to make GGUF files that transformers and radixrt then both
read: Llama and the dense families transformers reads from GGUF (Qwen2, Qwen3, Phi-3, Gemma 2,
Gemma 3).
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np
from gguf_quantize import quantize

TOKENIZER_KEYS = {  # the default GGUF's tokenizer fields, copied as they are
    "tokenizer.ggml.model": "add_tokenizer_model",
    "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list",
    "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.merges": "add_token_merges",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id",
    "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.unknown_token_id": "add_unk_token_id",
    "tokenizer.ggml.padding_token_id": "add_pad_token_id",
    "tokenizer.ggml.add_bos_token": "add_add_bos_token",
    "tokenizer.chat_template": "add_chat_template",
}


# llama.cpp's choice for a matrix whose rows are not whole 256-wide super-blocks (the default
# model's 576-wide ones) in a k-quant file
K_FALLBACK = {
    gguf.GGMLQuantizationType.Q4_K: gguf.GGMLQuantizationType.Q5_0,
    gguf.GGMLQuantizationType.Q5_K: gguf.GGMLQuantizationType.Q5_1,
    gguf.GGMLQuantizationType.Q6_K: gguf.GGMLQuantizationType.Q8_0,
}


def matrix_type(qtype: gguf.GGMLQuantizationType, cols: int) -> gguf.GGMLQuantizationType:
    return K_FALLBACK[qtype] if qtype in K_FALLBACK and cols % 256 else qtype


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (the inverse of transformers' reverse permutation)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _copy_tokenizer(writer: gguf.GGUFWriter, source: pathlib.Path, vocab_size: int) -> None:
    """The source's tokenizer cut to its first vocab_size tokens (the merges among them kept): a
    small vocabulary keeps both readers' tokenizer conversions fast."""
    reader = gguf.GGUFReader(str(source))
    for key, method in TOKENIZER_KEYS.items():
        if key not in reader.fields:
            continue
        value = reader.fields[key].contents()
        if key == "tokenizer.ggml.tokens" or key == "tokenizer.ggml.token_type":
            value = value[:vocab_size]
        elif key == "tokenizer.ggml.merges":
            kept = set(reader.fields["tokenizer.ggml.tokens"].contents()[:vocab_size])
            value = [
                m for m in value if "".join(m.split(" ")) in kept and set(m.split(" ")) <= kept
            ]
        getattr(writer, method)(value)


def _quantize(t: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype in (gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q5_1):
        return gguf.quants.quantize(t, qtype)  # gguf's own; tests/gguf_quantize.py has the six
    return quantize(t, qtype)


# transformers' model_type -> gguf's architecture
GGUF_ARCH = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}  # fmt: skip


def _write_config(w: gguf.GGUFWriter, c, head_dim: int, theta: float) -> None:
    w.add_name("tiny test model")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(c.vocab_size)
    if getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)


def write_gguf(state: dict, config, path: pathlib.Path, qtype, tokenizer_from) -> pathlib.Path:
    """state: a float32 state dict (transformers' names) of config's architecture (one of
    GGUF_ARCH), written under gguf's own names for them. Matrices (the embedding and an untied
    lm_head included) in qtype (a k-quant's fallback where rows are not whole super-blocks, as
    llama.cpp does), norms and biases in F32."""
    arch = GGUF_ARCH[config.model_type]
    names = gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), config.num_hidden_layers
    )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    theta = (rope.get("full_attention") or rope)["rope_theta"]
    w = gguf.GGUFWriter(str(path), arch)
    _write_config(w, config, head_dim, float(theta))
    _copy_tokenizer(w, tokenizer_from, config.vocab_size)
    gemma = arch.startswith("gemma")
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for hf_name, tensor in state.items():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None or (base == "lm_head" and config.tie_word_embeddings):
            continue  # the embedding serves as lm_head
        t = tensor.float().numpy()
        if arch == "llama" and base.rpartition(".")[2] in heads:
            t = permute(t, heads[base.rpartition(".")[2]])
        if t.ndim == 1:
            w.add_tensor(f"{gguf_name}.{suffix}", t + 1.0 if gemma and "norm" in base else t)
        else:
            t_type = matrix_type(qtype, t.shape[1])
            w.add_tensor(f"{gguf_name}.{suffix}", _quantize(t, t_type), raw_dtype=t_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
