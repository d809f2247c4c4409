"""Where a token sits, as the layers see it: RoPE's cos/sin tables (the scaled variants through
transformers' own formulas, per layer type where a config has several) and each layer's sliding
window."""

from __future__ import annotations

import torch

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_tables(
    hf_config, head_dim: int, max_context: int, layer_type: str = "full_attention"
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * inv_freq for positions [0, max_context): [max_context, D/2] float32
    each. A config whose rope parameters are per layer type (Gemma 3: full_attention,
    sliding_attention) gives layer_type's."""
    params = dict(
        getattr(hf_config, "rope_parameters", None)
        or getattr(hf_config, "rope_scaling", None)
        or {}
    )
    per_type = {"full_attention", "sliding_attention"} & set(params)
    if per_type:
        params = dict(params.get(layer_type) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} is not supported; expected one of {STATIC_ROPE_TYPES}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        attention_scaling = 1.0
    else:  # the scaled variants: transformers' own formulas, so the frequencies are bit-identical
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        kwargs = {"layer_type": layer_type} if per_type else {}
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", **kwargs)
    freqs = (
        torch.arange(max_context, dtype=torch.int64).float()[:, None] * inv_freq.float()[None, :]
    )
    return freqs.cos() * attention_scaling, freqs.sin() * attention_scaling


def layer_windows(hf_config, num_layers: int) -> list[int | None]:
    """Each layer's sliding window (keys within that many positions of the query, itself included),
    or None for full attention: Mistral's `sliding_window` on every layer; a config's `layer_types`
    (Qwen2 with use_sliding_window, hybrid local/global models) naming the sliding ones. Pages
    before a window are kept (the radix tree may share them with requests that need them), not
    freed."""
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return [None] * num_layers
    types = getattr(hf_config, "layer_types", None)
    if types is None:
        return [window] * num_layers
    return [window if t == "sliding_attention" else None for t in types[:num_layers]]
