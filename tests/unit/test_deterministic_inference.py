"""--enable-deterministic-inference: a request's ids and per-token logprobs are bitwise those of the
same request alone on a fresh engine (the reference), whatever shares its steps, whether its prefix
came from the radix cache or was computed, at any chunked-prefill size and page size, after a
preemption, with jump-forward and prompt-lookup drafts. The scheduler and the model runner are the
real ones, on a tiny random Llama (2 layers, 4 q / 2 kv heads) whose prompts cross the attention's
256-position key chunks. test_without_the_flag_the_same_draws_differ shows that these draws do
tell the kernels apart: without the flag, today's kernels give other bits for the same requests."""

from __future__ import annotations

import functools
import random
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler import assert_all_pages_back

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.engine.scheduler_factory import create_scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions

NEW_TOKENS = 6
_rng = random.Random(5)
SHARED = [_rng.randrange(3, 3000) for _ in range(300)]  # crosses a 256-key chunk
PROMPTS = [SHARED + [_rng.randrange(3, 3000) for _ in range(n)] for n in (3, 40, 1, 90)] + [
    [_rng.randrange(3, 3000) for _ in range(n)] for n in (5, 270, 33)
]
# a repetitive prompt, so prompt-lookup drafts are offered and accepted
PROMPTS.append([7, 8, 9, 10, 11] * 12)
# a regex whose forced text the grammar feeds as a jump-forward draft
REGEX = r"The answer is (yes|no)\."


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny-deterministic")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=False, initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(d), safe_serialization=True)
    tokenizer.save_pretrained(str(d))
    return str(d)


def scheduler(model_path: str, deterministic: bool = True, **cfg):
    cfg.setdefault("max_total_tokens", 8192)
    cfg.setdefault("dtype", "float32")
    config = ServerConfig(
        model_path=model_path, enable_deterministic_inference=deterministic, **cfg
    )
    return create_scheduler(config)


def params(k: int, new_tokens: int = NEW_TOKENS) -> dict:
    p = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0}
    if k == 2:  # a seeded sampled request
        p.update(temperature=0.9, top_p=0.95, seed=1234)
    if k == 3:
        p.update(regex=REGEX, max_new_tokens=12)
    return p


def add(s, rid: str, k: int, new_tokens: int) -> None:
    # prompt logprobs (which the radix cache cannot supply: their positions are recomputed) for
    # one prompt only, so that the others' prefixes come from the cache
    start = 0 if k == 6 else -1
    opts = RequestOptions(return_logprob=True, logprob_start_len=start, top_logprobs_num=2)
    s.add_request(
        TokenizedGenerateReq(
            rid=rid, input_ids=PROMPTS[k], sampling_params=params(k, new_tokens), options=opts
        )
    )


def answer(outs) -> tuple:
    """ids, (logprob, id) per new token, prompt logprobs, top logprobs: everything compared."""
    return (
        [t for o in outs for t in o.new_ids],
        [lp for o in outs for lp in o.output_logprobs],
        [o.input_logprobs for o in outs if o.input_logprobs is not None],
        [top for o in outs for top in o.output_top_logprobs],
    )


def drain(s, outs: dict, arrivals: list[tuple[int, str, int]], new_tokens=NEW_TOKENS) -> None:
    """Steps until idle; arrivals: (step, rid, prompt index) added when that step comes."""
    pending = sorted(arrivals)
    step, deadline = 0, time.monotonic() + 120
    while pending or s.has_work():
        while pending and pending[0][0] <= step:
            _, rid, k = pending.pop(0)
            add(s, rid, k, new_tokens)
        if not s.step():  # waiting (a grammar compiling in its worker process)
            time.sleep(0.005)
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
        s.check_integrity()
        step += 1
        assert time.monotonic() < deadline, "the scheduler did not finish"


@functools.cache
def reference(model_path: str, k: int, new_tokens=NEW_TOKENS, dtype="float32", kv="auto") -> tuple:
    """Prompt k alone on a fresh engine."""
    s = scheduler(model_path, dtype=dtype, kv_cache_dtype=kv)
    try:
        outs: dict = {}
        drain(s, outs, [(0, "ref", k)], new_tokens)
        return answer(outs["ref"])
    finally:
        s.close()


def run_batch(
    model_path, deterministic, arrivals, warm: list[int], stats=None, new_tokens=NEW_TOKENS, **cfg
) -> dict:
    """Each request's answer after warming the cache with `warm` and running `arrivals`; stats: a
    dict that gets the scheduler's counters."""
    s = scheduler(model_path, deterministic, **cfg)
    try:
        outs: dict = {}
        if warm:  # the cache holds these prompts (their KV computed in their own batch)
            drain(s, outs, [(0, f"warm{k}", k) for k in warm])
        drain(s, outs, arrivals, new_tokens)
        assert_all_pages_back(s)
        if stats is not None:
            stats.update(vars(s.stats))
        return {rid: answer(o) for rid, o in outs.items()}
    finally:
        s.close()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(range(len(PROMPTS)))), min_size=1, max_size=6
    ),
    warm=st.lists(st.sampled_from(range(len(PROMPTS))), max_size=2),
    page_size=st.sampled_from([1, 4, 16]),
    chunk=st.sampled_from([16, 64, 512]),
    tight_pool=st.booleans(),
    ngram=st.booleans(),
    tier=st.booleans(),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    kv=st.sampled_from(["auto", "int8"]),
)
def test_any_batch_cache_chunking_and_page_size_gives_the_alone_bits(
    tiny_dir, picks, warm, page_size, chunk, tight_pool, ngram, tier, dtype, kv
):
    arrivals = [(step, f"r{i}", k) for i, (step, k) in enumerate(picks)]
    # a tight pool evicts (to the second tier, when on) and preempts: it holds about two of the
    # longest requests at once
    pool = 1200 if tight_pool else 8192
    got = run_batch(
        tiny_dir, True, arrivals, warm, page_size=page_size, chunked_prefill_size=chunk,
        max_total_tokens=pool, speculative_algorithm="ngram" if ngram else "none",
        enable_hierarchical_cache=tier, dtype=dtype, kv_cache_dtype=kv,
    )  # fmt: skip
    for _, rid, k in arrivals:
        want = reference(tiny_dir, k, NEW_TOKENS, dtype, kv)
        assert got[rid] == want, f"{rid} (prompt {k}) differs from alone"


def test_preemption_jump_forward_and_prompt_lookup_keep_the_bits(tiny_dir):
    """The draws above may miss them: here each happens (the counters say so) and changes no bit."""
    arrivals = [(0, "a", 1), (0, "b", 5), (0, "c", 3), (1, "d", 7), (1, "e", 2), (2, "f", 6)]
    stats: dict = {}
    got = run_batch(
        tiny_dir, True, arrivals, [0], stats, new_tokens=40, page_size=4,
        chunked_prefill_size=64, max_total_tokens=480, speculative_algorithm="ngram",
    )  # fmt: skip
    assert stats["num_preemptions"] > 0 and stats["num_draft_tokens"] > 0, stats
    assert stats["cached_tokens"] > 0, stats
    for _, rid, k in arrivals:
        assert got[rid] == reference(tiny_dir, k, 40), f"{rid} (prompt {k}) differs from alone"


def test_without_the_flag_the_same_draws_differ(tiny_dir):
    """The property's draws are sensitive: with the fast kernels (no flag, no cache-invariant
    prefill) a batch with a warm cache gives other logprob bits than alone, so the test above can
    fail."""
    arrivals = [(0, "a", 0), (0, "b", 1), (1, "c", 5), (2, "d", 4)]
    fast = {"cache_invariant_prefill": False, "chunked_prefill_size": 64}
    batch = run_batch(tiny_dir, False, arrivals, [3], **fast)
    alone = {}
    for _, rid, k in arrivals:
        alone[rid] = run_batch(tiny_dir, False, [(0, rid, k)], [], **fast)[rid]
    assert any(batch[rid] != alone[rid] for rid in alone)
    # and with the flag the same requests agree bit for bit
    det = run_batch(tiny_dir, True, arrivals, [3], chunked_prefill_size=64)
    assert all(det[rid] == reference(tiny_dir, k) for _, rid, k in arrivals)


def test_an_architecture_without_invariant_kernels_is_refused(tmp_path, tokenizer):
    from model_cases import save_random_model, tiny_moe_config

    save_random_model(tiny_moe_config("olmoe"), tokenizer, tmp_path)
    with pytest.raises(ValueError, match="not supported for this architecture"):
        scheduler(str(tmp_path))


@pytest.mark.parametrize("invariant_prefill", [True, False])
def test_the_default_warm_cache_changes_no_answer_of_a_request_alone(tiny_dir, invariant_prefill):
    """Without the flag, the default's cache-invariant prefill: a request alone answers bitwise as
    it did alone on a fresh engine when its prefix was computed by other requests, in other
    batches and chunks. With --no-cache-invariant-prefill the same warm requests give other bits
    (what the default fixes)."""
    cfg = {"cache_invariant_prefill": invariant_prefill, "chunked_prefill_size": 64}
    cold = {k: run_batch(tiny_dir, False, [(0, "x", k)], [], **cfg)["x"] for k in (1, 2, 3)}
    s = scheduler(tiny_dir, False, **cfg)
    try:
        outs: dict = {}
        # the shared prefix computed in a batch of four, in 64-token chunks beside decode rows
        drain(s, outs, [(0, "w0", 0), (0, "w1", 4), (1, "w2", 5), (3, "w3", 6)])
        warm = {}
        for k in (1, 2, 3):  # each alone, its 300-token prefix from the cache
            drain(s, outs, [(0, f"k{k}", k)])
            warm[k] = answer(outs[f"k{k}"])
        assert s.stats.cached_tokens > 0
    finally:
        s.close()
    if invariant_prefill:
        assert warm == cold
    else:
        assert warm != cold
