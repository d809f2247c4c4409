"""The fused-MoE Triton kernel (kernels/moe_triton.py) compiled on the GPU at serving shapes
(Mixtral-like 8 experts top-2, Qwen2-MoE-like 60 experts top-4; a prefill chunk and a decode step
that leaves most experts unchosen) against the CPU path's formulas (moe_layer.experts) run on CUDA.

Skipped without CUDA. The kernel is imported only after the skip: triton.jit picks
interpreted-or-compiled at decoration time, and the CPU tier interprets it (tests/triton)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from radixrt.kernels.moe_triton import fused_experts  # noqa: E402
from radixrt.runtime.model.models import moe_layer  # noqa: E402

HIDDEN, INTER = 2048, 1408
# fp32 runs exact (ieee) dots; bf16 rows of gate_up may round one ulp apart between the two paths
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def make_case(num_tokens, num_experts, top_k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to("cuda", dtype)

    w = moe_layer.MoeWeights(
        router=rand(num_experts, HIDDEN, scale=HIDDEN**-0.5 * 4),  # sharp: tokens really differ
        gate_up=rand(num_experts, 2 * INTER, HIDDEN, scale=HIDDEN**-0.5),
        down=rand(num_experts, HIDDEN, INTER, scale=INTER**-0.5),
        top_k=top_k,
        renormalize=top_k > 1,
    )
    x = rand(num_tokens, HIDDEN)
    weights, ids = moe_layer.route(x, w)
    return x, weights, ids, w


@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,dtype",
    [
        (256, 8, 2, torch.bfloat16),
        (16, 8, 2, torch.bfloat16),
        (256, 60, 4, torch.bfloat16),
        (8, 60, 4, torch.bfloat16),  # 32 pairs over 60 experts: most get none
        (64, 8, 2, torch.float32),
    ],
)
def test_fused_experts_at_serving_shapes(num_tokens, num_experts, top_k, dtype):
    x, weights, ids, w = make_case(num_tokens, num_experts, top_k, dtype)
    want = moe_layer.experts(x, weights, ids, w)
    got = fused_experts(x, weights, ids, w.gate_up, w.down)
    assert got.dtype == dtype and got.shape == x.shape
    tol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
