"""Which class runs which architecture: config.json's `architectures` (or, lacking it, its
`model_type`) -> the model class, imported only when chosen. An architecture not listed here is
refused by name at start-up, before any weight is read."""

from __future__ import annotations

import importlib
from typing import Any

_PACKAGE = "radixrt.runtime.model.models"

# architecture -> (module under models/, class)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "OlmoeForCausalLM": ("olmoe", "OlmoeForCausalLM"),
}

# model_type -> architecture, for configs without `architectures`
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}


def architecture_of(config: dict[str, Any], where: str = "the config") -> str:
    """The supported architecture a config.json (as a dict) names; ValueError naming it if none."""
    names = config.get("architectures") or []
    if not names and config.get("model_type") in MODEL_TYPES:
        names = [MODEL_TYPES[config["model_type"]]]
    for name in names:
        if name in ARCHITECTURES:
            return name
    named = names or [f"model_type {config.get('model_type')!r}"]
    raise ValueError(
        f"{where}: architecture {', '.join(map(str, named))} is not supported; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def model_class(hf_config) -> type:
    """The class for a transformers config object."""
    name = architecture_of(
        {
            "architectures": getattr(hf_config, "architectures", None),
            "model_type": getattr(hf_config, "model_type", None),
        }
    )
    module, cls = ARCHITECTURES[name]
    return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), cls)
