"""LoRA's Triton kernels compiled on the GPU at the default model's shapes (8 slots, rank 16, a
decode batch and a prefill chunk mixing slots and base rows) against the per-row reference.

Skipped without CUDA (tests/triton runs the same kernels under the interpreter)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from lora_cases import random_adapter, reference  # noqa: E402

from radixrt.runtime.model.lora_adapter import TargetDims  # noqa: E402
from radixrt.runtime.model.lora_pool import LoraPool, LoraStep  # noqa: E402


@pytest.mark.parametrize("num_tokens", [16, 512])
def test_kernels_at_serving_shapes(num_tokens):
    gen = torch.Generator().manual_seed(0)
    dims = TargetDims.llama(hidden=576, q_out=576, kv_out=192, inter=1536, layers=1)
    cuda = torch.device("cuda")
    pool = LoraPool(dims, num_slots=8, max_rank=16, dtype=torch.bfloat16, device=cuda)
    adapters = {}
    for s in range(8):
        ad = random_adapter(f"a{s}", 4 + 2 * s, dims, 0, ("q_proj", "v_proj", "down_proj"), gen)
        adapters[ad.name] = ad
        pool.load(s, ad)
    slots = [(i % 9) - 1 for i in range(num_tokens)]  # -1: the base model
    step = LoraStep.for_items(pool, [s if s >= 0 else None for s in slots], [1] * num_tokens, cuda)
    names = [None if s < 0 else f"a{s}" for s in slots]
    for group, targets, fan_in in (
        ("qkv", ("q_proj", "k_proj", "v_proj"), 576),
        ("down", ("down_proj",), 1536),
    ):
        width = sum(dims.dims[t][1] for t in targets)
        x = (torch.randn(num_tokens, fan_in, generator=gen) * 0.5).to(torch.bfloat16)
        base = torch.randn(num_tokens, width, generator=gen).to(torch.bfloat16)
        want = reference(adapters, names, targets, 0, x, base, dims)
        got = base.to(cuda)
        step.layer(0)(group, x.to(cuda), got)
        torch.testing.assert_close(got.float().cpu(), want, rtol=3e-2, atol=3e-2)
