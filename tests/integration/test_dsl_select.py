"""select on the real model picks the argmax of each method's score, where the scores are
recomputed from transformers' logprobs on the same token ids (the independent truth)."""

from __future__ import annotations

import pytest
from dsl_shared import Recorder, engine_backend, hf_prompt_logprobs

import radixrt as sgl

CASES = [
    # the prefix ends in a space: the tokenizer merges it into each choice (" Paris")
    ("Question: What is the capital of France?\nAnswer: ", ["Paris", "London", "Berlin, Germany"]),
    (
        "<|im_start|>user\nIs the sun hot? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n",
        ["yes", "no", "Yes"],
    ),
    ("The color of grass is", [" green", " blue", " a bright shade of red"]),
]
METHODS = [
    sgl.token_length_normalized,
    sgl.greedy_token_selection,
    sgl.unconditional_likelihood_normalized,
]


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def expected_scores(be, prefix: str, choices: list[str], method) -> tuple[list, list[list[float]]]:
    prefix_ids = be.tokenize(prefix)
    conds, unconds = [], []
    for c in choices:
        full = be.tokenize(prefix + c)
        start = min(_lcp(prefix_ids, full), len(full) - 1)
        conds.append(hf_prompt_logprobs(full)[start - 1 :])
        unconds.append([0.0] + hf_prompt_logprobs(full[start:]))
    if method is sgl.token_length_normalized:
        return [sum(c) / len(c) for c in conds], conds
    if method is sgl.unconditional_likelihood_normalized:
        return [sum(a - b for a, b in zip(c, u)) / len(c) for c, u in zip(conds, unconds)], conds
    # greedy: compare position by position, shorter choices padded with their mean
    width = max(len(c) for c in conds)
    rows = [c + [sum(c) / len(c)] * (width - len(c)) for c in conds]
    return rows, conds


def expected_pick(scores, method) -> tuple[int, float]:
    """The winner and its margin over the runner-up (to skip near ties)."""
    if method is not sgl.greedy_token_selection:
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return order[0], scores[order[0]] - scores[order[1]]
    remaining, margin = list(range(len(scores))), float("inf")
    for j in range(len(scores[0])):
        best = max(scores[i][j] for i in remaining)
        others = [scores[i][j] for i in remaining if scores[i][j] != best]
        if others:
            margin = min(margin, best - max(others))
        remaining = [i for i in remaining if scores[i][j] == best]
        if len(remaining) == 1:
            break
    return remaining[0], margin


@sgl.function
def pick(s, prefix, choices, method):
    s += prefix
    s += sgl.select("choice", choices=choices, choices_method=method)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: repr(m))
def test_select_picks_the_argmax_of_independently_computed_scores(method):
    be = engine_backend()
    decided = 0
    for prefix, choices in CASES:
        state = pick.run(prefix=prefix, choices=choices, method=method, backend=be)
        scores, conds = expected_scores(be, prefix, choices, method)
        meta = state.get_meta_info("choice")
        assert len(meta["input_token_logprobs"]) == len(conds) == len(choices)
        for got, want in zip(meta["input_token_logprobs"], conds):
            assert [e[0] for e in got] == pytest.approx(want, abs=2e-3)
        winner, margin = expected_pick(scores, method)
        if margin > 5e-3:  # a near tie may go either way within float error
            assert state["choice"] == choices[winner], (prefix, scores)
            decided += 1
    assert decided >= len(CASES) // 2, (
        f"only {decided} of {len(CASES)} cases had a clear winner to check"
    )


def test_select_scores_all_choices_in_one_request_after_caching_the_prefix():
    be = engine_backend()
    be.flush_cache()
    prefix, choices = CASES[0]
    with Recorder(be) as rec:
        pick.run(prefix=prefix, choices=choices, method=sgl.token_length_normalized, backend=be)
    (cache_payload, cache_metas), (score_payload, score_metas) = rec.calls
    assert cache_payload["sampling_params"]["max_new_tokens"] == 0
    assert len(score_payload["input_ids"]) == len(choices) and score_payload["return_logprob"]
    shared = len(cache_payload["input_ids"])
    assert score_payload["logprob_start_len"] == shared
    # the prefix was not recomputed: only its last token, whose logits the first choice token needs
    assert all(m["cached_tokens"] >= shared - 1 for m in score_metas)
