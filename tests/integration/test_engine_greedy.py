"""Greedy radixrt output == Hugging Face transformers greedy output, token for token.

Truth: transformers `generate(do_sample=False)` on the same model in float32. Batch shape
changes floating-point summation order, so a divergence is accepted only at a step where
the reference's top-two logits are within TIE_GAP, and the test checks that explicitly.
"""

import pytest
import torch

from radixrt import Engine

NEW_TOKENS = 24
TIE_GAP = 1e-4
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain in one sentence what a CPU does.",
    "What is 17 plus 25?",
    "Give me a synonym for happy.",
]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    out = []
    for q in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def hf_reference(hf_model, prompts, new_tokens):
    """Per prompt: HF greedy tokens and the top-two logit gap at every generated position."""
    refs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            out = hf_model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False
            )
            gen = out[0, len(ids) :].tolist()
            logits = hf_model(out).logits[0, len(ids) - 1 : -1]
            top2 = logits.topk(2, dim=-1).values
            refs.append((gen, (top2[:, 0] - top2[:, 1]).tolist()))
    return refs


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    return hf_reference(hf_model, prompts, NEW_TOKENS)


def assert_matches_reference(outputs, reference, label):
    for i, (got, (ref, gaps)) in enumerate(zip(outputs, reference)):
        n = min(len(got), len(ref))
        first_diff = next((k for k in range(n) if got[k] != ref[k]), None)
        if first_diff is None:
            assert len(got) == len(ref), (
                f"{label} prompt {i}: length {len(got)} vs reference {len(ref)}"
            )
            continue
        assert gaps[first_diff] < TIE_GAP, (
            f"{label} prompt {i}: diverges at token {first_diff} ({got[first_diff]} vs {ref[first_diff]}) where the "
            f"reference's top-two gap is {gaps[first_diff]:.2e}, not a tie"
        )


def generate(engine, prompts, one_by_one):
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    if one_by_one:
        return [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]


def assert_no_leak(engine):
    engine.check_integrity()
    assert engine.flush_cache()
    info = engine.get_server_info()
    assert info["kv_pages_free"] == info["kv_pages_total"]
    engine.check_integrity()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("disable_radix_cache", [False, True])
def test_greedy_equals_transformers(model_dir, prompts, reference, page_size, disable_radix_cache):
    engine = Engine(
        dtype="float32",
        model_path=str(model_dir),
        page_size=page_size,
        disable_radix_cache=disable_radix_cache,
        max_total_tokens=8192,
    )
    try:
        label = f"page_size={page_size} cache={'off' if disable_radix_cache else 'on'}"
        assert_matches_reference(
            generate(engine, prompts, one_by_one=False), reference, label + " batched"
        )
        # the second pass finds every prompt (and earlier outputs) in the tree when the cache is on
        outs = [
            engine.generate(
                input_ids=p, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS}
            )
            for p in prompts
        ]
        assert_matches_reference([o["output_ids"] for o in outs], reference, label + " one by one")
        cached = [o["meta_info"]["cached_tokens"] for o in outs]
        if disable_radix_cache:
            assert cached == [0] * len(prompts)
        else:
            assert all(c >= len(p) - page_size for c, p in zip(cached, prompts)), cached
        assert_no_leak(engine)
    finally:
        engine.shutdown()


def test_chunked_prefill_and_preemption_keep_greedy_output(model_dir, prompts, reference):
    # a pool smaller than the batch's demand and tiny chunks: requests are split and preempted
    demand = sum(len(p) + NEW_TOKENS for p in prompts)
    engine = Engine(
        dtype="float32",
        model_path=str(model_dir),
        page_size=16,
        chunked_prefill_size=32,
        max_total_tokens=(demand // 2) // 16 * 16,
    )
    try:
        assert_matches_reference(
            generate(engine, prompts, one_by_one=False), reference, "chunked+preempted"
        )
        assert engine.get_server_info()["num_preemptions"] > 0, (
            "the pool was meant to force preemption"
        )
        assert_no_leak(engine)
    finally:
        engine.shutdown()


def test_shared_prefix_prompts_reuse_cache_and_keep_output(model_dir, tokenizer, hf_model):
    system = "You are a careful assistant. Answer briefly and exactly. " * 6
    prompts = []
    for q in QUESTIONS[:4]:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    shared = next(i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1)
    engine = Engine(dtype="float32", model_path=str(model_dir), page_size=1, max_total_tokens=8192)
    try:
        outs = engine.generate(
            input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 12}
        )
        # in-batch sharing: one request computes the shared prefix, the others reuse it
        assert sum(o["meta_info"]["cached_tokens"] for o in outs) >= (len(prompts) - 1) * (
            shared - 1
        )
        assert_matches_reference(
            [o["output_ids"] for o in outs], hf_reference(hf_model, prompts, 12), "shared"
        )
        assert_no_leak(engine)
    finally:
        engine.shutdown()
