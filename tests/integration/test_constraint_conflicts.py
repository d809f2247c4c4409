"""#35: constraints the sampling parameters contradict are the client's error, never the server's. Where it can be
known up front (a regex or choices too short for min_new_tokens) the request is refused naming both; otherwise it
ends at the step with an abort reason naming the conflict and status 400, and the batch's other requests go on.
A logit_bias of -100 on every token the constraint allows is not a conflict (the bias is added, not a ban)."""

from __future__ import annotations

import time

import pytest

from radixrt import Engine
from radixrt.runtime.request.stop_regex_check import KILL_AFTER_S

PROMPT = "Answer yes or no: is the sky blue?"


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32")
    yield e
    e.shutdown()


@pytest.mark.parametrize(
    "params",
    [
        {"regex": "", "min_new_tokens": 1},
        {"regex": "(ab){1,2}", "min_new_tokens": 17},
        {"choices": ["yes", "no"], "min_new_tokens": 4},
    ],
)
def test_known_conflicts_are_refused_naming_both(engine, params):
    with pytest.raises(ValueError, match="min_new_tokens") as err:
        engine.generate(PROMPT, {"max_new_tokens": 30, **params})
    assert list(params)[0] in str(err.value)


def test_conflict_found_at_the_step_fails_only_that_request_as_a_400(engine):
    # a grammar whose only sentence is empty, and min_new_tokens 1: the edge does not read grammars' lengths (a
    # complete match of a longer one ends the request as a stop, the minimum notwithstanding)
    outs = engine.generate(
        [PROMPT, PROMPT],
        [
            {"temperature": 0, "max_new_tokens": 8, "ebnf": 'root ::= ""', "min_new_tokens": 1},
            {"temperature": 0, "max_new_tokens": 8},
        ],
    )
    bad, fine = outs
    reason = bad["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "min_new_tokens" in reason["message"], reason
    assert "internal error" not in reason["message"]
    assert (
        fine["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        and len(fine["output_ids"]) > 0
    )
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats.num_step_failures == 0  # the client's error, not a failed step


def test_logit_bias_against_every_allowed_token_still_finishes_inside_the_constraint(engine):
    tok = engine.tokenizer
    ids = {
        t
        for word in ("yes", "no", " yes", " no")
        for t in tok.encode(word, add_special_tokens=False)
    }
    out = engine.generate(
        PROMPT,
        {
            "temperature": 0,
            "max_new_tokens": 8,
            "choices": ["yes", "no"],
            "logit_bias": {str(t): -100 for t in ids},
        },
    )
    assert out["text"] in ("yes", "no") and out["meta_info"]["finish_reason"]["type"] == "stop"
    engine.scheduler.check_integrity()


@pytest.mark.parametrize(
    "params, field",
    [
        (
            {"stop_regex": "[ab]*a[ab]{26}"},
            "stop_regex",
        ),  # 2**27 states: built in a worker, stopped
        ({"stop_regex": "(((a{9999}){9999}){9999})"}, "stop_regex"),
        ({"regex": "(((a{9999}){9999}){9999})", "min_new_tokens": 4}, "regex"),
    ],
)
def test_the_engine_refuses_explosive_patterns_in_bounded_time(engine, params, field):
    """#41: the Engine checks as the server's edge does: no automaton blows up in its process."""
    started = time.monotonic()
    with pytest.raises(ValueError, match=field):
        engine.generate(PROMPT, {"max_new_tokens": 2, **params})
    # the worker is killed at KILL_AFTER_S; an unbounded build would run for minutes (a loaded
    # 2-core machine may take a while to notice and restart the worker)
    assert time.monotonic() - started < KILL_AFTER_S + 25
