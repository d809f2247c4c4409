"""LoRA test cases shared by the interpreter tier (tests/triton) and the GPU tier (tests/gpu):
random adapters, and the per-row reference of their update."""

from __future__ import annotations

import torch

from radixrt.runtime.model.lora_adapter import LoraAdapter


def random_adapter(name, rank, dims, layer, targets, gen):
    weights = {}
    for target in targets:
        fan_in, fan_out = dims.dims[target]
        a = torch.randn(rank, fan_in, generator=gen) * 0.1
        b = torch.randn(fan_out, rank, generator=gen) * 0.1
        weights[(layer, target)] = (a, b)
    return LoraAdapter(name, "", rank, 2.0 / rank, weights)


def reference(adapters, row_names, targets, layer, x, out, dims):
    """Row by row: out[t, target's columns] += scaling * B @ (A @ x[t])."""
    out = out.clone().float()
    offset = 0
    for target in targets:
        width = dims.dims[target][1]
        for t, name in enumerate(row_names):
            ad = adapters.get(name)
            if ad is None or (layer, target) not in ad.weights:
                continue
            a, b = ad.weights[(layer, target)]
            out[t, offset : offset + width] += ad.scaling * (b @ (a @ x[t].float()))
        offset += width
    return out
