"""The Engine's arguments in the shapes SGLang's offline API accepts: one value for every prompt, or
a list with one per prompt."""

from __future__ import annotations

from typing import Any


def per_prompt(sampling_params: Any, lora_path: Any, num_prompts: int) -> tuple[list, list]:
    """generate's sampling_params and lora_path, one per prompt (a single one applies to all)."""
    params = (
        sampling_params if isinstance(sampling_params, list) else [sampling_params] * num_prompts
    )
    loras = lora_path if isinstance(lora_path, list) else [lora_path] * num_prompts
    if len(params) != num_prompts or len(loras) != num_prompts:
        raise ValueError(
            f"got {len(params)} sampling_params and {len(loras)} lora_path for "
            f"{num_prompts} prompts"
        )
    return params, loras
