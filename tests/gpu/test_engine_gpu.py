"""The engine with the compiled Triton backend on a GPU against the torch backend on the same GPU
(the CPU tier only interprets the kernels). Skipped without CUDA; `bash benchmarks/gpu_check.sh` runs it."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from radixrt import Engine  # noqa: E402

try:
    from radixrt.runtime.model.weights import resolve_model

    resolve_model(None)
except (
    OSError,
    ValueError,
    ImportError,
) as e:  # the default model's package is not on this machine
    pytest.skip(f"default model not available: {e}", allow_module_level=True)

PROMPTS = [
    "The three primary colors are red, yellow and blue. Mixing two of them gives a secondary color: "
    "red and yellow make orange, yellow and blue make green, and blue and red make purple." + tail
    for tail in ("", " The sky is", " Grass is")
]
PARAMS = {"temperature": 0, "max_new_tokens": 24}


def run(backend: str, page_size: int) -> tuple[list[list[int]], list[int]]:
    engine = Engine(
        dtype="float32",
        device="cuda",
        attention_backend=backend,
        page_size=page_size,
        max_total_tokens=8192,
    )
    try:
        outs = [engine.generate(PROMPTS[0], PARAMS)] + engine.generate(PROMPTS[1:], PARAMS)
        engine.check_integrity()
        return [o["output_ids"] for o in outs], [o["meta_info"]["cached_tokens"] for o in outs]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_compiled_triton_engine_matches_torch_on_the_gpu(page_size):
    triton_out, triton_cached = run("triton", page_size)
    torch_out, torch_cached = run("torch", page_size)
    assert triton_cached == torch_cached and min(triton_cached[1:]) >= 2 * 16
    assert triton_out == torch_out
