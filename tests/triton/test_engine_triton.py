"""The whole engine on the Triton backend (interpreted on CPU) against the torch backend.

Truth: the torch backend's greedy tokens (tests/integration checks those against transformers), and
the cached-token count an independent computation predicts from the token ids. The prompts span several
pages of 16, so the second one really reads its prefix from the radix cache through the Triton kernels.
The model is the session's tiny random Llama with the default tokenizer (2 layers, GQA): the
interpreter costs ~0.25 s per layer per step, and what is checked here is the kernels' plumbing through
the engine, which 2 layers exercise as 30 do (tests/triton's kernel tests cover shapes).
"""

import pytest

from radixrt import Engine

pytestmark = pytest.mark.integration

BASE = (
    "The three primary colors are red, yellow and blue. Mixing two of them gives a secondary color: "
    "red and yellow make orange, yellow and blue make green, and blue and red make purple."
)
EXTENDED = BASE + " The sky is"
PARAMS = {"temperature": 0, "max_new_tokens": 6}


def expected_cached(tokenizer, first_output: list[int], page_size: int) -> int:
    """What the radix tree can give the second prompt: the first request's prompt and output, but for
    the last output token (its KV is never computed), matched against the second prompt but for its
    last token (whose logits are needed), in whole pages."""
    base = tokenizer.encode(BASE, add_special_tokens=False)
    ext = tokenizer.encode(EXTENDED, add_special_tokens=False)
    in_tree = base + first_output[:-1]
    common = 0
    for a, b in zip(in_tree, ext[:-1]):
        if a != b:
            break
        common += 1
    return common // page_size * page_size


def run(engine: Engine) -> tuple[list[list[int]], list[int]]:
    first = engine.generate(BASE, PARAMS)
    # extends the first: its prefix comes from the radix cache
    second = engine.generate(EXTENDED, PARAMS)
    engine.check_integrity()
    return [first["output_ids"], second["output_ids"]], [
        first["meta_info"]["cached_tokens"],
        second["meta_info"]["cached_tokens"],
    ]


@pytest.fixture(scope="module")
def torch_run(tiny_model_dir):
    engine = Engine(
        dtype="float32",
        model_path=tiny_model_dir,
        attention_backend="torch",
        max_total_tokens=2048,
        page_size=16,
    )
    try:
        return run(engine)
    finally:
        engine.shutdown()


def test_triton_engine_matches_torch_engine_through_the_cache(tiny_model_dir, torch_run):
    page_size = 16
    engine = Engine(
        dtype="float32",
        model_path=tiny_model_dir,
        attention_backend="triton",
        page_size=page_size,
        max_total_tokens=2048,
    )
    try:
        outputs, cached = run(engine)
        want = expected_cached(engine.tokenizer, outputs[0], page_size)
        assert want >= 2 * page_size, "the test prompts must share several pages"
        assert cached == [0, want] == torch_run[1]
        assert outputs == torch_run[0]
    finally:
        engine.shutdown()
