"""The GPU LoRA kernels (kernels/lora_triton.py, through LayerLora's GPU path) under the Triton
interpreter against the CPU path (model/lora_pool.py: every slot's shrink, the row's own slot kept,
one expand): batches mixing slots of different ranks and rows of the base model, into the fused
outputs of q/k/v and of down, in float32 and bfloat16; and both against a plain per-row reference."""

from __future__ import annotations

import pytest
import torch
from lora_cases import random_adapter, reference

from radixrt.runtime.model.lora_adapter import TargetDims
from radixrt.runtime.model.lora_pool import LoraPool, LoraStep


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_and_cpu_paths_equal_the_per_row_reference(dtype):
    gen = torch.Generator().manual_seed(0)
    dims = TargetDims.llama(hidden=48, q_out=48, kv_out=16, inter=80, layers=2)
    pool = LoraPool(dims, num_slots=3, max_rank=8, dtype=dtype, device=torch.device("cpu"))
    adapters = {
        "r4": random_adapter("r4", 4, dims, 1, ("q_proj", "v_proj", "down_proj"), gen),
        "r8": random_adapter("r8", 8, dims, 1, ("k_proj", "down_proj"), gen),
    }
    pool.load(0, adapters["r4"])
    pool.load(2, adapters["r8"])
    slots, lengths = [2, None, 0, 2, 0], [3, 2, 1, 4, 1]
    step = LoraStep.for_items(pool, slots, lengths, torch.device("cpu"))
    names = {0: "r4", 2: "r8"}
    row_names = [names.get(s) for s, n in zip(slots, lengths) for _ in range(n)]
    num_tokens = sum(lengths)
    for group, targets, fan_in in (
        ("qkv", ("q_proj", "k_proj", "v_proj"), 48),
        ("down", ("down_proj",), 80),
    ):
        width = sum(dims.dims[t][1] for t in targets)
        x = (torch.randn(num_tokens, fan_in, generator=gen) * 0.5).to(dtype)
        base = torch.randn(num_tokens, width, generator=gen).to(dtype)
        want = reference(adapters, row_names, targets, 1, x, base, dims)
        cpu = base.clone()
        step.layer(1)(group, x, cpu)
        gpu = base.clone()
        step.layer(1)._gpu(pool.groups[group], x, gpu)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(cpu.float(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(gpu.float(), want, rtol=tol, atol=tol)
        base_rows = torch.tensor([n is None for n in row_names])
        assert torch.equal(gpu[base_rows], base[base_rows]), "changed a base-model row"
        assert torch.equal(cpu[base_rows], base[base_rows]), "changed a base-model row"
        assert not torch.equal(gpu, base)
