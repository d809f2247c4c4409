"""Prompt-lookup drafts (--speculative-algorithm ngram) change how many forwards run, never the output:
against the same engine with drafts off (token-by-token decoding is the truth), greedy and seeded
sampled outputs are equal token for token, logprobs agree, stops inside a draft cut where they
would, and no page leaks."""

import pytest

from radixrt import Engine

FEW_SHOT = "".join(
    f"Q: What is the capital of {c}?\nA: The capital of {c} is {k}.\n\n"
    for c, k in [
        ("France", "Paris"),
        ("Spain", "Madrid"),
        ("Italy", "Rome"),
        ("Japan", "Tokyo"),
        ("Peru", "Lima"),
    ]
)
QUESTIONS = ["France", "Italy", "Kenya", "Canada", "Japan", "Chile"]


@pytest.fixture(scope="module")
def engines():
    on = Engine(dtype="float32", max_total_tokens=8192, speculative_algorithm="ngram")
    off = Engine(dtype="float32", max_total_tokens=8192, speculative_algorithm="none")
    yield on, off
    on.shutdown()
    off.shutdown()


def run(engine, params, **kw):
    stats = engine.scheduler.stats
    before = stats.num_forwards, stats.num_draft_tokens, stats.num_draft_accepted
    outs = engine.generate(
        [FEW_SHOT + f"Q: What is the capital of {q}?\nA:" for q in QUESTIONS], params, **kw
    )
    engine.check_integrity()
    return (
        outs,
        stats.num_forwards - before[0],
        stats.num_draft_tokens - before[1],
        stats.num_draft_accepted - before[2],
    )


def test_greedy_equal_with_logprobs(engines):
    on, off = engines
    params = {"temperature": 0, "max_new_tokens": 48, "min_new_tokens": 48, "ignore_eos": True}
    outs_on, fwd_on, drafted, accepted = run(on, params, return_logprob=True)
    outs_off, fwd_off, _, _ = run(off, params, return_logprob=True)
    for a, b in zip(outs_on, outs_off):
        assert a["output_ids"] == b["output_ids"], (a["text"], b["text"])
        lp_on = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
        lp_off = [lp for lp, _, _ in b["meta_info"]["output_token_logprobs"]]
        assert lp_on == pytest.approx(lp_off, abs=1e-3)
    # the few-shot answers repeat the prompt's pattern: drafts were tried, some kept, forwards saved
    assert drafted > 0 and accepted > 0 and fwd_on < fwd_off, (drafted, accepted, fwd_on, fwd_off)


def test_seeded_sampling_and_stops_equal(engines):
    on, off = engines
    params = [
        {"temperature": 1.0, "top_p": 0.9, "seed": 7 + i, "max_new_tokens": 40, "stop": ["\n\nQ:"]}
        for i in range(len(QUESTIONS))
    ]
    outs_on, _, drafted, _ = run(on, params)
    outs_off, _, _, _ = run(off, params)
    assert [o["output_ids"] for o in outs_on] == [o["output_ids"] for o in outs_off]
    assert [o["text"] for o in outs_on] == [o["text"] for o in outs_off]
    assert drafted > 0
    for engine in engines:
        assert engine.flush_cache()
        info = engine.get_server_info()
        assert info["kv_pages_free"] == info["kv_pages_total"]


def test_the_same_question_again_drafts_the_earlier_answer_from_the_tree(engines):
    """#57: drafts from the radix tree: the second asking finds the first answer after its prompt
    (the first request's tokens went into the tree when it ended) and verifies it in a few wide
    steps instead of one step a token; the answer is the same, token for token, and equal to the
    engine without drafts."""
    on, off = engines
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."
    params = {"temperature": 0, "max_new_tokens": 40, "min_new_tokens": 40, "ignore_eos": True}
    first = on.generate(prompt, params)
    stats = on.scheduler.stats
    before = stats.num_forwards, stats.num_draft_tokens, stats.num_draft_accepted
    again = on.generate(prompt, params)
    forwards = stats.num_forwards - before[0]
    accepted = stats.num_draft_accepted - before[2]
    assert again["output_ids"] == first["output_ids"] == off.generate(prompt, params)["output_ids"]
    # 40 tokens: the first from the prompt's step, 39 to draft; 4 a step, each fully kept
    assert accepted >= 30 and forwards <= 12, (
        accepted,
        forwards,
        stats.num_draft_tokens - before[1],
    )
    on.check_integrity()
