"""A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors), read with the
safetensors package and checked against the model: every weight's layer, target and shape, the
rank against --max-lora-rank, the targets against --lora-target-modules. Anything else is a
LoraError naming the problem (a 400 at the request edge, an error at start for --lora-paths).

A target's update is scaling * B @ A (A [rank, in], B [out, rank]); scaling is lora_alpha / rank
(lora_alpha / sqrt(rank) with use_rslora), as PEFT computes it.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

from radixrt.runtime.config_checks import LORA_TARGETS as TARGETS

_KEY = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight"
)


class LoraError(ValueError):
    """An adapter that cannot be served as given."""


@dataclass(frozen=True)
class TargetDims:
    """(in, out) features of each target in this model."""

    dims: dict[str, tuple[int, int]]
    num_layers: int

    @classmethod
    def llama(cls, hidden: int, q_out: int, kv_out: int, inter: int, layers: int) -> TargetDims:
        return cls(
            {
                "q_proj": (hidden, q_out),
                "k_proj": (hidden, kv_out),
                "v_proj": (hidden, kv_out),
                "o_proj": (q_out, hidden),
                "gate_proj": (hidden, inter),
                "up_proj": (hidden, inter),
                "down_proj": (inter, hidden),
            },
            layers,
        )


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # (layer, target) -> (A [rank, in], B [out, rank]) float32
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def targets(self) -> set[str]:
        return {t for _, t in self.weights}


def parse_lora_path(spec: str) -> tuple[str, str]:
    """SGLang's --lora-paths entry: name=path, or a path (named after its directory)."""
    name, sep, path = spec.partition("=")
    if not sep:
        path = spec
        name = os.path.basename(os.path.normpath(spec))
    if not name or not path:
        raise LoraError(f"--lora-paths entry {spec!r} must be name=path or a path")
    return name, path


def load_adapter(
    name: str, path: str, dims: TargetDims, max_rank: int, allowed: tuple[str, ...]
) -> LoraAdapter:
    """The adapter at path, checked against the model's dims, max_rank and the allowed targets."""
    config = _read_config(name, path)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoraError(f"LoRA adapter {name!r}: adapter_config.json r must be an int >= 1")
    if rank > max_rank:
        raise LoraError(f"LoRA adapter {name!r} has rank {rank}, above --max-lora-rank {max_rank}")
    for key, off in (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none")):
        if config.get(key, off) != off:
            raise LoraError(f"LoRA adapter {name!r}: {key}={config[key]!r} is not supported")
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save"):
        if config.get(key):
            raise LoraError(f"LoRA adapter {name!r}: {key} is not supported")
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = _read_weights(name, path, dims, rank, allowed)
    return LoraAdapter(name, path, rank, float(scaling), weights)


def _read_config(name: str, path: str) -> dict:
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise LoraError(f"LoRA adapter {name!r}: no adapter_config.json in {path}")
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise LoraError(f"LoRA adapter {name!r}: adapter_config.json unreadable: {e}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"LoRA adapter {name!r}: adapter_config.json is not a LoRA config")
    return config


def _read_weights(
    name: str, path: str, dims: TargetDims, rank: int, allowed: tuple[str, ...]
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(file):
        raise LoraError(f"LoRA adapter {name!r}: no adapter_model.safetensors in {path}")
    try:
        tensors = load_file(file)
    except (SafetensorError, OSError) as e:
        raise LoraError(
            f"LoRA adapter {name!r}: adapter_model.safetensors unreadable: {e}"
        ) from None
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.fullmatch(key)
        if m is None:
            raise LoraError(f"LoRA adapter {name!r}: weight {key} targets no supported projection")
        layer, target, half = int(m.group(1)), m.group(2), m.group(3)
        if target not in TARGETS or target not in allowed:
            raise LoraError(
                f"LoRA adapter {name!r} targets {target}, not among the served targets "
                f"{', '.join(allowed)} (--lora-target-modules)"
            )
        if layer >= dims.num_layers:
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} does not exist in this model")
        fan_in, fan_out = dims.dims[target]
        want = (rank, fan_in) if half == "A" else (fan_out, rank)
        if tuple(t.shape) != want:
            raise LoraError(
                f"LoRA adapter {name!r}: {key} has shape {tuple(t.shape)}, this model needs {want}"
            )
        halves.setdefault((layer, target), {})[half] = t.float()
    for (layer, target), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoraError(f"LoRA adapter {name!r}: layer {layer} {target} lacks lora_A or lora_B")
    if not halves:
        raise LoraError(f"LoRA adapter {name!r}: adapter_model.safetensors holds no LoRA weights")
    return {k: (v["A"], v["B"]) for k, v in halves.items()}
