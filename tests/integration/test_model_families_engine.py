"""The families beyond Llama through the whole engine: a tiny random model of each (the
default model's vocabulary, saved with transformers, that tokenizer beside it) served from its
directory gives transformers' greedy tokens and prompt logprobs for a batch of prompts of different
lengths, prefilled in chunks shorter than the prompts; a prompt sharing a cached prefix reuses it
and decodes the same; every page comes back."""

from __future__ import annotations

import pytest
import torch
from model_cases import dense_family_config, save_random_model, tiny_moe_config

from radixrt import Engine

NEW_TOKENS = 10
SHARED = "You are a careful assistant. Answer in one short line, plainly and without lists. "
PROMPTS = [
    SHARED + "What is the capital of France?",
    "Hi",
    "Count from one to five, separated by commas:",
    SHARED + "Name a colour of the sky at dusk.",
]


def save_tiny(kind: str, model_dir, out_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = dense_family_config(kind) if kind in DENSE else tiny_moe_config(kind)
    return save_random_model(config, tok, out_dir), tok


DENSE = ("phi3_fused_sliding", "gemma2_softcapped", "gemma3_local_rope")
MOE = ("mixtral_sliding", "qwen2_moe_shared_dense_layer", "qwen3_moe", "olmoe")


@pytest.mark.parametrize("kind", DENSE + MOE)
def test_family_serves_transformers_tokens_and_logprobs(kind, model_dir, tmp_path):
    hf, tok = save_tiny(kind, model_dir, tmp_path / kind)
    eng = Engine(
        model_path=str(tmp_path / kind), dtype="float32", page_size=4, chunked_prefill_size=8,
        max_total_tokens=2048,
    )  # fmt: skip
    try:
        sp = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        outs = eng.generate(PROMPTS, sp, return_logprob=True, logprob_start_len=0)
        for prompt, out in zip(PROMPTS, outs):
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                want = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0]
                logits = hf(ids).logits[0].float()
            assert out["output_ids"] == want[ids.shape[1] :].tolist(), (kind, prompt)
            got = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]
            expect = torch.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(got), expect, atol=1e-4, rtol=1e-4)
        again = eng.generate(PROMPTS[3], sp)
        assert again["output_ids"] == outs[3]["output_ids"]
        assert again["meta_info"]["cached_tokens"] >= len(tok(SHARED).input_ids) - 4
        eng.check_integrity()
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kind", ["mixtral_sliding", "gemma2_softcapped"])
def test_family_with_int8_kv_grammar_preemption_and_second_tier(kind, model_dir, tmp_path):
    """What the engine already had, on the new families: an int8 KV pool too small for the batch
    (the newest request is preempted and recomputed), a JSON-schema request, chunked prefill and
    the host-memory tier behind the pool. Outputs equal a roomy engine's with the same pool dtype;
    the constrained output is valid JSON of its schema; every page comes back."""
    import json

    import jsonschema

    save_tiny(kind, model_dir, tmp_path / kind)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    long_prompt = " ".join(["apple", "pear", "plum", "fig"] * 25)
    prompts = [long_prompt, PROMPTS[2], PROMPTS[0]]
    params = [
        {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(schema)},
        {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True},
    ]
    common = dict(model_path=str(tmp_path / kind), dtype="float32", kv_cache_dtype="int8",
                  page_size=4, chunked_prefill_size=16)  # fmt: skip
    roomy = Engine(**common, max_total_tokens=2048)
    try:
        want = roomy.generate(prompts, params)
    finally:
        roomy.shutdown()
    small = Engine(
        **common, max_total_tokens=144, enable_hierarchical_cache=True, hicache_ratio=4.0
    )
    try:
        outs = small.generate(prompts, params)
        assert small.scheduler.stats.num_preemptions > 0
        assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in want]
        jsonschema.validate(json.loads(outs[1]["text"]), schema)
        small.check_integrity()
        assert small.flush_cache()
        assert (
            small.scheduler.memory.allocator.num_free == small.scheduler.memory.allocator.num_pages
        )
    finally:
        small.shutdown()
