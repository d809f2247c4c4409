"""The whole engine on the Triton backend (interpreted on CPU) against the torch backend.

Truth: the torch backend's greedy tokens, which tests/integration checks against transformers.
Short prompts and few tokens: the interpreter costs ~0.25 s per layer per step.
"""
import pytest

from radixrt import Engine

pytestmark = pytest.mark.integration

BASE = "The three primary colors are"
EXTENDED = BASE + " red, yellow and blue. The sky is"
PARAMS = {"temperature": 0, "max_new_tokens": 4}


@pytest.fixture(scope="module")
def torch_outputs(model_dir):
    engine = Engine(dtype="float32", model_path=str(model_dir), attention_backend="torch", max_total_tokens=2048)
    try:
        return [engine.generate(p, PARAMS)["output_ids"] for p in (BASE, EXTENDED)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_engine_matches_torch_engine(model_dir, torch_outputs, page_size):
    engine = Engine(dtype="float32", model_path=str(model_dir), attention_backend="triton", page_size=page_size,
                    max_total_tokens=2048)
    try:
        first = engine.generate(BASE, PARAMS)
        # the second prompt extends the first: its prefix comes from the radix cache
        second = engine.generate(EXTENDED, PARAMS)
        assert [first["output_ids"], second["output_ids"]] == torch_outputs
        base_len = first["meta_info"]["prompt_tokens"]
        assert second["meta_info"]["cached_tokens"] >= base_len - page_size
        engine.check_integrity()
    finally:
        engine.shutdown()
