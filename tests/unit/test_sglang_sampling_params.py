"""SGLang's /generate sampling parameters: every one is known; stop_regex (searched incrementally by an automaton)
stops exactly where Python's `re` first finds a match; no_stop_trim keeps the stop string; refusals name the field."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_detokenizer import BYTE_TOK, run_stream

from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer
from radixrt.runtime.request.sampling_param_names import (
    RADIXRT_SAMPLING_PARAMS,
    SGLANG_SAMPLING_PARAMS,
)
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.request.stop_regex import StopRegexSearch

# SGLang 0.5.23's SamplingParams API fields, written out here (not imported from the code under test)
SGLANG_0_5_23 = {
    "max_new_tokens": 8,
    "stop": ["x"],
    "stop_token_ids": [2],
    "stop_regex": [r"\d\d"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "repetition_penalty": 1.1,
    "min_new_tokens": 1,
    "n": 1,
    "beam_width": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "no_stop_trim": True,
    "stream_interval": 4,
    "logit_bias": {"5": 1.0},
    "sampling_seed": 7,
    "custom_params": {"k": 1},
    "watermark": None,
}


def test_every_sglang_parameter_is_accepted_and_listed_once():
    assert set(SGLANG_0_5_23) == set(SGLANG_SAMPLING_PARAMS)
    assert not set(SGLANG_SAMPLING_PARAMS) & set(RADIXRT_SAMPLING_PARAMS)
    sp = SamplingParams.from_dict(SGLANG_0_5_23)
    assert (
        sp.seed == 7 and sp.stop_regex == [r"\d\d"] and sp.no_stop_trim and sp.stream_interval == 4
    )
    assert SamplingParams.from_dict({"stop_regex": "a+b"}).stop_regex == ["a+b"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"top_logprobs": 3}, "top_logprobs"),  # an OpenAI name, not a /generate sampling parameter
        ({"beam_width": 17}, "beam_width"),
        ({"structural_tag": '{"structures": []}'}, "structural_tag"),
        ({"structural_tag": '{"type": "structural_tag", "format": {}}'}, "structural_tag"),
        ({"structural_tag": "{}", "regex": "a"}, "structural_tag"),  # one constraint per request
        ({"stop_regex": "(a"}, "stop_regex"),
        (
            {"stop_regex": r"(?<=a)b"},
            "stop_regex",
        ),  # lookarounds and anchors: no automaton means them as re does
        ({"stop_regex": r"a(?=b)"}, "stop_regex"),
        ({"stop_regex": r"end$"}, "stop_regex"),
        ({"stop_regex": r"(a)\1"}, "stop_regex"),
        ({"stop_regex": "a*"}, "stop_regex"),  # matches the empty string: would stop at once
        ({"stop_regex": 5}, "stop_regex"),
        ({"stream_interval": 0}, "stream_interval"),
        ({"no_stop_trim": "yes"}, "no_stop_trim"),
        ({"custom_params": [1]}, "custom_params"),
        ({"seed": 1, "sampling_seed": 2}, "sampling_seed"),
    ],
)
def test_refusals_name_the_parameter(params, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict(params)


PATTERNS = [
    r"\d\d",
    r"ab+a",
    r"[A-Z][a-z]+ [A-Z]",
    r"(lo|ol)\n",
    r"x{3}",
    r"é.",
    r"[^a-z ]{2}",
    r"a(b|c)*d",
]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("abcdlo xXé12\nAB")), max_size=40),
    pattern=st.sampled_from(PATTERNS),
    seed=st.integers(0, 2**16),
)
def test_incremental_search_finds_the_first_match_end_as_re_does(text, pattern, seed):
    rng = random.Random(seed)
    expected = next((i for i in range(1, len(text) + 1) if re.search(pattern, text[:i])), None)
    search, fed, found = StopRegexSearch(pattern), 0, None
    while fed < len(text) and found is None:
        piece = text[fed : fed + rng.randint(1, 4)]
        hit = search.feed(piece)
        found = None if hit is None else fed + hit
        fed += len(piece)
    assert found == expected


def test_pathological_pattern_costs_one_step_per_character():
    # (a+)+b over a run of a's takes exponential time in a backtracking search; the automaton is linear
    search = StopRegexSearch("(a+)+b")
    assert search.feed("a" * 50_000) is None
    assert search.feed("b") == 1


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab lo\né12x")), max_size=40),
    seed=st.integers(0, 2**16),
)
def test_stop_regex_keeps_the_match_and_stops_at_its_token(text, seed):
    rng = random.Random(seed)
    ids = BYTE_TOK.encode(text, rng)
    detok = IncrementalDetokenizer(BYTE_TOK, stop_regex=[r"\d\d"])
    sent, consumed = "", 0
    for i in range(0, len(ids), 2):
        sent += detok.feed(ids[i : i + 2], finished=i + 2 >= len(ids))
        consumed = i + 2
        if detok.finished:
            break
    m = re.search(r"\d\d", text)
    if m is None:
        assert sent == text and detok.matched_stop is None
    else:
        assert detok.matched_stop == r"\d\d"
        # the text runs through the step that completed the match: the match is kept, nothing after that step
        assert sent.startswith(text[: m.end()]) and text.startswith(sent)
        assert len(BYTE_TOK.decode(ids[:consumed]).encode()) >= len(sent.encode())


def test_no_stop_trim_keeps_the_stop_string():
    deltas, detok = run_stream(BYTE_TOK, list(b"one STOP two"), stop=["STOP"])
    assert "".join(deltas) == "one " and detok.matched_stop == "STOP"
    kept = IncrementalDetokenizer.for_request(BYTE_TOK, {"stop": ["STOP"], "no_stop_trim": True})
    out = "".join(kept.feed([b], finished=False) for b in b"one STOP two")
    assert out == "one STOP" and kept.matched_stop == "STOP"


def test_dsl_gen_passes_stop_regex_and_adds_up_streamed_logprobs():
    from radixrt.frontend import api, ir
    from radixrt.frontend.interpreter import merge_stream_meta

    sampling, _ = api.gen("x", stop_regex=r"\d+\.").params.resolve(ir.GenParams())
    assert SamplingParams.from_dict(sampling).stop_regex == [r"\d+\."]
    meta = None
    for chunk in (
        {"completion_tokens": 1, "output_token_logprobs": [[-0.1, 5, None]]},
        {"completion_tokens": 3, "output_token_logprobs": [[-0.2, 6, None], [-0.3, 7, None]]},
    ):
        meta = merge_stream_meta(meta, chunk)
    assert meta["completion_tokens"] == 3 and [x[1] for x in meta["output_token_logprobs"]] == [
        5,
        6,
        7,
    ]
