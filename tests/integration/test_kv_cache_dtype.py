"""--kv-cache-dtype int8 / fp8_e4m3 on the real model: quality floor, the pool's size, and the cache machinery.

Truth: transformers in float32. Teacher-forced top-1 agreement (transformers' own greedy continuation fed
back) over 8 chat prompts x 48 tokens, in chunks of 8 tokens so that nearly every key is read back from the
quantised pool, must reach 95% for int8 (the issue's floor; benchmarks/bench_kv_cache.py measures 24
prompts and fp8 too). The radix tree and preemption run unchanged on quantised pages: a shared prefix is
reused and a pool too small for the batch preempts, and nothing leaks.
"""

import os
import sys

import pytest

from radixrt import Engine

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_kv_cache import NUM_TOKENS, teacher_forced  # noqa: E402

pytestmark = pytest.mark.integration
FLOOR = {"int8": 0.95, "fp8_e4m3": 0.90}


@pytest.fixture(scope="module")
def refs(chat_references):
    assert len(chat_references[0][1]) == NUM_TOKENS
    return chat_references[:8]  # each reference is its prompt's alone: the first 8 of the 24


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
def test_quantized_kv_top1_agreement_with_transformers_fp32(refs, kv):
    engine = Engine(dtype="float32", kv_cache_dtype=kv, chunked_prefill_size=8, page_size=8)
    try:
        assert (
            engine.scheduler.admin.server_info()["kv_cache_dtype"]
            == {"int8": "int8", "fp8_e4m3": "float8_e4m3fn"}[kv]
        )
        agree, total, delta = teacher_forced(engine, refs)
        engine.check_integrity()
    finally:
        engine.shutdown()
    print(
        f"KV {kv}: top-1 agreement {agree}/{total} = {agree / total:.4f}, mean |d logprob| {delta:.4f}"
    )
    assert total == len(refs) * NUM_TOKENS
    assert agree / total >= FLOOR[kv]


def test_pool_holds_more_tokens_in_the_same_bytes():
    sizes = {}
    for kv in ("auto", "int8"):
        e = Engine(dtype="float32", kv_cache_dtype=kv, max_total_tokens=256)
        sizes[kv] = e.scheduler.runner.kv_bytes_per_token
        e.shutdown()
    # float32 K and V (4 bytes an element) vs int8 plus a 4-byte scale per head_dim-64 row
    assert sizes["auto"] / sizes["int8"] == pytest.approx(4 * 64 / (64 + 4))


def test_radix_cache_and_preemption_on_quantized_pages():
    engine = Engine(kv_cache_dtype="int8", max_total_tokens=700, page_size=4)
    try:
        system = "You are a helpful assistant who answers in one short sentence. " * 4
        first = engine.generate(system + "What is 2+2?", {"temperature": 0, "max_new_tokens": 8})
        again = engine.generate(system + "What is 2+2?", {"temperature": 0, "max_new_tokens": 8})
        assert (
            again["meta_info"]["cached_tokens"] > 40 and again["output_ids"] == first["output_ids"]
        )
        outs = engine.generate(
            [f"Story {i}: once upon a time" for i in range(8)],
            {"temperature": 0, "max_new_tokens": 120, "ignore_eos": True},
        )
        assert all(o["meta_info"]["completion_tokens"] == 120 for o in outs)
        assert engine.scheduler.stats.num_preemptions > 0, (
            "the pool was meant to be too small for the batch"
        )
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_n_seeded_samples_fork_and_equal_the_same_seeds_one_by_one():
    """n samples share the prompt's prefill (the later ones fork: cached_tokens = prompt - 1) and each equals
    the same seed run alone, token for token (fp32; the fork copies KV, it computes nothing differently). With
    an int8 pool a batch of 4 and a batch of 1 may round a K value to different int8 steps (the matmuls block
    differently), so token equality is asked of the float32 pool only."""
    engine = Engine(dtype="float32", page_size=16, max_total_tokens=4096)
    try:
        prompt = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Tell me a short story about a fox and a crow. " * 4}],
            tokenize=False,
            add_generation_prompt=True,
        )
        n_prompt = len(engine.tokenizer.encode(prompt))
        assert (n_prompt - 1) % 16, "the prompt must end inside a page for the fork to copy one"
        params = {"temperature": 0.9, "seed": 7, "max_new_tokens": 24}
        together = engine.generate(prompt, {**params, "n": 4})
        assert sorted(o["meta_info"]["cached_tokens"] for o in together)[1:] == [n_prompt - 1] * 3
        engine.flush_cache()
        alone = [engine.generate(prompt, {**params, "seed": 7 + i}) for i in range(4)]
        assert [o["output_ids"] for o in together] == [o["output_ids"] for o in alone]
        assert len({tuple(o["output_ids"]) for o in alone}) > 1, "different seeds should differ"
        engine.check_integrity()
    finally:
        engine.shutdown()
