"""select: the request pattern (cache the prefix, then ONE batched logprob request),
the token boundary, and each choices method against a hand computation."""

from __future__ import annotations

import math

import pytest
from frontend_fake_backend import FakeBackend

import radixrt as sgl
from radixrt.frontend.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)


def _run_select(be, method=token_length_normalized, prefix="Answer: ", choices=("yes", "no way")):
    @sgl.function
    def prog(s):
        s += prefix
        s += sgl.select("pick", choices=list(choices), choices_method=method)

    return prog.run(backend=be)


def test_select_caches_the_prefix_then_scores_all_choices_in_one_request():
    be = FakeBackend(logprobs={" yes": -1.0, " no": -0.5, " way": -3.0})
    state = _run_select(be)
    # mean logprobs: " yes" -> -1.0 ; " no", " way" -> -1.75
    assert state["pick"] == "yes" and state.text() == "Answer: yes"
    cache_req, *score_reqs = be.log
    # "Answer: " + "yes" tokenizes as "Answer", ":", " yes": the prefix's trailing " " merges
    # into the choice, so the shared, cached part is "Answer:" (2 tokens).
    assert (
        cache_req["input_ids"] == be.tokenize("Answer:")
        and cache_req["sampling"]["max_new_tokens"] == 0
    )
    assert len(score_reqs) == 2 and all(
        r["logprob_start_len"] == 2 and r["return_logprob"] for r in score_reqs
    )
    assert all(r["sampling"]["max_new_tokens"] == 0 for r in score_reqs)
    assert all(r["cached_tokens"] == 2 for r in score_reqs)
    meta = state.get_meta_info("pick")
    assert meta["normalized_prompt_logprobs"] == [-1.0, -1.75]
    assert [[e[1] for e in entries] for entries in meta["input_token_logprobs"]] == [
        be.tokenize(" yes"),
        be.tokenize(" no way"),
    ]


def test_select_without_boundary_merge_scores_exactly_the_choice_tokens():
    be = FakeBackend(logprobs={"B": -0.1, "A": -2.0})
    state = _run_select(be, prefix="Q?\n", choices=["A", "B"])
    assert state["pick"] == "B"
    assert all(r["logprob_start_len"] == 3 for r in be.log[1:])  # "Q", "?", "\\n" then the choice


def test_greedy_token_selection_walks_positions_and_pads_short_choices_with_their_mean():
    be = FakeBackend(logprobs={" Paris": -0.2, ",": -4.0, " France": -0.1, " Lyon": -3.0})
    state = _run_select(be, greedy_token_selection, "City: ", ["Paris", "Paris, France", "Lyon"])
    # position 0 ties " Paris" (-0.2) between choices 0 and 1; position 1: choice 0 padded with
    # its mean (-0.2) beats "," (-4.0)
    assert state["pick"] == "Paris"
    matrix = state.get_meta_info("pick")["greedy_logprob_matrix"]
    assert matrix[0] == [-0.2, -0.2, -0.2] and matrix[1] == [-0.2, -4.0, -0.1]
    # token_length_normalized prefers "Paris" as well; make the long one win on mean instead
    be2 = FakeBackend(logprobs={" Paris": -0.2, ",": -0.1, " France": -0.1, " Lyon": -3.0})
    assert (
        _run_select(be2, token_length_normalized, "City: ", ["Paris", "Paris, France"])["pick"]
        == "Paris, France"
    )
    assert (
        _run_select(be2, greedy_token_selection, "City: ", ["Paris", "Paris, France"])["pick"]
        == "Paris, France"
    )


def test_unconditional_likelihood_normalized_sends_a_second_batched_request():
    # " the" is likely anywhere: conditional -1.0; unconditionally its first token has no
    # logprob (0), so the score is the conditional minus the unconditional tail.
    be = FakeBackend(logprobs={" the": -1.0, " cat": -2.0, " sat": -2.0, " zebra": -2.5})
    state = _run_select(be, unconditional_likelihood_normalized, "Word: ", ["the cat", "zebra"])
    # the cat: cond [-1, -2], uncond [None->0, -2] -> mean(-1, 0) = -0.5 ; zebra: cond [-2.5],
    # uncond [None->0] -> -2.5
    assert state["pick"] == "the cat"
    meta = state.get_meta_info("pick")
    assert meta["normalized_unconditional_prompt_logprobs"] == [-0.5, -2.5]
    uncond_reqs = be.log[3:]
    assert [r["input_ids"] for r in uncond_reqs] == [be.tokenize(" the cat"), be.tokenize(" zebra")]
    assert all(r["logprob_start_len"] == 0 for r in uncond_reqs)


def test_select_at_temperature_samples_by_softmax_of_scores():
    be = FakeBackend(logprobs={" a": -1.0, " b": -1.0 - math.log(3)})

    @sgl.function
    def prog(s):
        s += "x: "
        s += sgl.select("p", choices=["a", "b"], temperature=1.0)

    picks = [prog.run(backend=be)["p"] for _ in range(200)]
    share = picks.count("a") / len(picks)
    assert 0.62 < share < 0.88  # expected 0.75


def test_gen_with_choices_is_select_and_custom_methods_get_sglang_arguments():
    seen = {}

    def method(**kwargs):
        seen.update(kwargs)
        return sgl.ChoicesDecision(kwargs["choices"][-1], {"custom": True})

    method.requires_unconditional_logprobs = False
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "Pick: "
        s += sgl.gen("g", choices=["x", "y"], choices_method=method)

    state = prog.run(backend=be)
    assert state["g"] == "y" and state.get_meta_info("g") == {"custom": True}
    assert set(seen) == {
        "choices",
        "normalized_prompt_logprobs",
        "input_token_logprobs",
        "output_token_logprobs",
        "unconditional_token_logprobs",
    }


def test_select_on_an_empty_prefix_and_bad_choices():
    be = FakeBackend(logprobs={"b": -1.0, "a": -5.0})

    @sgl.function
    def prog(s):
        s += sgl.select("p", choices=["a b", "b b"])

    # the first token has no logprob (nothing precedes it); the rest decides
    assert prog.run(backend=be)["p"] in ("a b", "b b")
    with pytest.raises(ValueError):
        sgl.select("p", choices=["a", ""])
    with pytest.raises(ValueError):
        sgl.select("p", choices="ab")
