"""transformers' own Llama on the default model's weights, float32 on the CPU: the independent truth
of the parity tests. One per process: the session fixture `hf_model` and the DSL tests' helpers
(integration/dsl_shared.py) share it instead of each loading ~540 MB of their own."""

from __future__ import annotations

import functools


@functools.cache
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.model.weights import transformers_dir

    model = AutoModelForCausalLM.from_pretrained(
        str(transformers_dir()), dtype=torch.float32, local_files_only=True
    )
    return model.eval()
