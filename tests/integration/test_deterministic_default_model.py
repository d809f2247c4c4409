"""--enable-deterministic-inference on the default model (SmolLM2-135M from its GGUF), in this
machine's default dtype and in bfloat16: a handful of greedy and seeded requests, each alone on a
flushed cache (the reference), then all at once on a cold cache (decode rows and prefill chunks
mixed), then all at once again with every prefix from the radix cache, then on a second engine with
other page and chunk sizes: output ids and per-token logprobs bitwise equal throughout. The unit
property test (tests/unit/test_deterministic_inference.py) draws the schedules on a tiny model."""

from __future__ import annotations

import pytest

from radixrt import Engine

pytestmark = pytest.mark.integration
SHARED = (
    "You are a careful assistant. Answer in one short sentence, then stop. Examples follow.\n"
    "Q: What colour is the sky on a clear day? A: Blue.\n"
    "Q: How many legs has a spider? A: Eight.\n"
)
PROMPTS = [
    SHARED + "Q: What is the capital of France? A:",
    SHARED + "Q: Which planet is the largest? A:",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
SEEDED = {"max_new_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 7, "ignore_eos": True}
PARAMS = [GREEDY, SEEDED, GREEDY, SEEDED]


def answers(outs) -> list[tuple]:
    meta = "output_token_logprobs", "output_top_logprobs"
    return [(o["output_ids"], *(o["meta_info"].get(k) for k in meta)) for o in outs]


def run_all(engine) -> list[tuple]:
    return answers(engine.generate(PROMPTS, PARAMS, return_logprob=True, top_logprobs_num=2))


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_default_model_answers_bitwise_alike_in_any_batch_and_cache_state(dtype):
    engine = Engine(enable_deterministic_inference=True, dtype=dtype)
    try:
        alone = []
        for prompt, params in zip(PROMPTS, PARAMS):
            engine.flush_cache()
            out = engine.generate(prompt, params, return_logprob=True, top_logprobs_num=2)
            alone += answers([out])
        engine.flush_cache()
        assert run_all(engine) == alone, "a cold mixed batch changed an answer"
        assert run_all(engine) == alone, "a warm cache changed an answer"
    finally:
        engine.shutdown()
    other = Engine(
        enable_deterministic_inference=True, dtype=dtype, page_size=16, chunked_prefill_size=32
    )
    try:
        assert run_all(other) == alone, "page size 16 / 32-token chunks changed an answer"
    finally:
        other.shutdown()
