"""Tensor parallelism over NCCL: the default model at TP=3 (or 2 heads' worth: TP must divide 9 query heads, so
3) greedy output equals TP=1, on a machine with at least 3 GPUs. Skipped elsewhere (the gloo version runs on the
CPU in tests/integration/test_tensor_parallel.py)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.device_count() < 3:
    pytest.skip("needs 3 CUDA devices", allow_module_level=True)

from radixrt import Engine  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]


def test_default_model_tp3_nccl_equals_tp1():
    outs = {}
    for tp in (1, 3):
        e = Engine(dtype="float32", tp_size=tp)
        try:
            outs[tp] = [
                o["output_ids"]
                for o in e.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 16})
            ]
        finally:
            e.shutdown()
    assert outs[3] == outs[1]
