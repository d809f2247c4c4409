"""The GPU LoRA kernels (kernels/lora_triton.py) under the Triton interpreter against the torch
path (model/lora_pool.py's grouped matmuls): batches mixing slots of different ranks and rows of
the base model, into a fused output's column slice, in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.lora_triton import lora_apply
from radixrt.runtime.model.lora_adapter import LoraAdapter, TargetDims
from radixrt.runtime.model.lora_pool import LoraPool, LoraStep


def random_adapter(name, rank, dims, layer, gen):
    weights = {}
    for target in ("q_proj", "down_proj"):
        fan_in, fan_out = dims.dims[target]
        a = torch.randn(rank, fan_in, generator=gen) * 0.1
        b = torch.randn(fan_out, rank, generator=gen) * 0.1
        weights[(layer, target)] = (a, b)
    return LoraAdapter(name, "", rank, 2.0 / rank, weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_equal_the_grouped_torch_path(dtype):
    gen = torch.Generator().manual_seed(0)
    dims = TargetDims.llama(hidden=48, q_out=48, kv_out=16, inter=80, layers=2)
    pool = LoraPool(dims, num_slots=3, max_rank=8, dtype=dtype, device=torch.device("cpu"))
    pool.load(0, random_adapter("r4", 4, dims, 1, gen))
    pool.load(2, random_adapter("r8", 8, dims, 1, gen))
    slots = [2, None, 0, 2, 0]
    lengths = [3, 2, 1, 4, 1]
    step = LoraStep.for_items(pool, slots, lengths, torch.device("cpu"))
    num_tokens = sum(lengths)
    row_slots = torch.tensor(
        [-1 if s is None else s for s, n in zip(slots, lengths) for _ in range(n)],
        dtype=torch.int32,
    )
    scalings = torch.tensor(pool.scalings, dtype=torch.float32)
    for target in ("q_proj", "down_proj"):
        fan_in, fan_out = dims.dims[target]
        x = torch.randn(num_tokens, fan_in, generator=gen).to(dtype)
        fused = torch.randn(num_tokens, fan_out + 16, generator=gen).to(dtype)
        want = fused.clone()
        step.layer(1)(target, x, want[:, :fan_out])
        got = fused.clone()
        a, b = pool.a[target][1], pool.b[target][1]
        lora_apply(x, a, b, row_slots, scalings, got[:, :fan_out])
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert torch.equal(got[:, fan_out:], fused[:, fan_out:]), "wrote past its columns"
        base_rows = row_slots < 0
        assert torch.equal(got[base_rows], fused[base_rows]), "changed a base-model row"
        assert not torch.equal(got, fused)
