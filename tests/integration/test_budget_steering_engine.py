"""Budget steering on the real model through Engine.generate (greedy, fp32): the outlines backend, and auto
(llguidance serving, an outlines shadow steering).

Truths: `jsonschema` for the output; the shortest completion is the distance table, itself checked against
brute force and the transition map in tests/unit/test_budget_steering.py. For every schema with an unbounded
field and budgets from tight to ample: output is schema-valid exactly when the shortest completion fits, and
otherwise ends with finish_reason length and meta_info.incomplete; an output that finishes inside its budget
is the same as with a budget twice as large (steering left it alone).
"""

import json
import sys
import time
from pathlib import Path

import pytest

from radixrt import Engine

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_budget_steering import UNBOUNDED  # noqa: E402
from test_json_schema_regex import validator  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    e = Engine(dtype="float32", grammar_backend="outlines")
    yield e
    e.shutdown()


def shortest(engine, schema) -> int:
    fut = engine.scheduler.grammar_backend("json_schema").request("json_schema", json.dumps(schema))
    while not fut.done():
        time.sleep(0.01)
    state = fut.result()
    return state.compiled.steering.dist[state.guide.get_state()]


def prompt(engine, name, schema) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a long JSON value for {name}: {json.dumps(schema)}"}],
        tokenize=False,
        add_generation_prompt=True,
    )


def test_output_is_valid_whenever_the_shortest_completion_fits(engine):
    cases = []
    for name, schema in UNBOUNDED.items():
        k = shortest(engine, schema)
        for budget in sorted({k - 1, k, k + 2, k + 6, 3 * k, 96}):
            if budget > 0:
                cases.append((name, schema, k, budget))
    outs = engine.generate(
        [prompt(engine, n, s) for n, s, _, _ in cases],
        [
            {"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": b}
            for _, s, _, b in cases
        ],
    )
    num_steered_valid = 0
    for (name, schema, k, budget), out in zip(cases, outs):
        meta = out["meta_info"]
        if budget >= k:
            value = json.loads(out["text"])  # complete: it parses and is valid
            errors = [e.message for e in validator(schema).iter_errors(value)]
            assert not errors, (name, budget, out["text"], errors)
            assert not meta.get("incomplete")
            num_steered_valid += meta["completion_tokens"] == budget  # it needed every token it had
        else:
            assert meta["finish_reason"]["type"] == "length" and meta.get("incomplete") is True, (
                name,
                budget,
            )
    # the unbounded fields really did run into their budget and were closed by steering
    assert num_steered_valid >= len(UNBOUNDED), num_steered_valid
    engine.check_integrity()


def test_output_that_finishes_inside_its_budget_is_untouched(engine):
    names = list(UNBOUNDED)
    params = [
        {"json_schema": json.dumps(UNBOUNDED[n]), "temperature": 0, "max_new_tokens": 48}
        for n in names
    ]
    small = engine.generate([prompt(engine, n, UNBOUNDED[n]) for n in names], params)
    large = engine.generate(
        [prompt(engine, n, UNBOUNDED[n]) for n in names],
        [{**p, "max_new_tokens": 96} for p in params],
    )
    compared = 0
    for name, a, b in zip(names, small, large):
        if (
            b["meta_info"]["finish_reason"]["type"] == "stop"
            and b["meta_info"]["completion_tokens"] <= 40
        ):
            assert a["output_ids"] == b["output_ids"], name
            compared += 1
    assert compared >= 2, "too few outputs finished inside the smaller budget to compare"


def test_llguidance_marks_cut_output_incomplete():
    llg = Engine(dtype="float32", grammar_backend="llguidance")
    try:
        schema = UNBOUNDED["free_string"]
        out = llg.generate(
            prompt(llg, "free_string", schema),
            {"json_schema": json.dumps(schema), "temperature": 0, "max_new_tokens": 3},
        )
        assert (
            out["meta_info"]["finish_reason"]["type"] == "length"
            and out["meta_info"]["incomplete"] is True
        )
    finally:
        llg.shutdown()


# additionalProperties: llguidance allows the keys, outlines does not
LEAVES_OUTLINES_LANGUAGE = {"open_object"}


def test_auto_steers_what_llguidance_serves(engine):
    """auto: llguidance serves, the outlines shadow steers while the output stays in outlines' language (this
    model's greedy output does for these schemas), so with the shadow compiled every budget that fits gives
    valid JSON."""
    auto = Engine(dtype="float32")  # the default, --grammar-backend auto
    try:
        cases = []
        for name, schema in UNBOUNDED.items():
            k = shortest(engine, schema)
            # outlines, cached once compiled
            shadow = auto.scheduler.grammar_backend("json_schema").secondary
            fut = shadow.request("json_schema", json.dumps(schema))
            while not fut.done():
                time.sleep(0.01)
            cases += [(name, schema, b) for b in (k, k + 3, 2 * k)]
        outs = auto.generate(
            [prompt(auto, n, s) for n, s, _ in cases],
            [
                {"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": b}
                for _, s, b in cases
            ],
        )
        for (name, schema, budget), out in zip(cases, outs):
            if name in LEAVES_OUTLINES_LANGUAGE and out["meta_info"].get("incomplete"):
                continue  # the model wrote an undeclared key, which outlines' DFA has not: the shadow was lost
            assert not out["meta_info"].get("incomplete"), (name, budget, out["text"])
            errors = [e.message for e in validator(schema).iter_errors(json.loads(out["text"]))]
            assert not errors, (name, budget, out["text"], errors)
        auto.check_integrity()
    finally:
        auto.shutdown()


def test_auto_steers_ebnf_grammars():
    """ebnf under auto: llguidance enforces the grammar, the DFA of its nesting-bounded regular subset
    (cfg_regex.py) steers, so once that DFA is compiled every budget that fits gives output the independent
    Lark parser accepts, and one token less ends incomplete."""
    from test_grammar_backends import GRAMMARS, lark  # noqa: F401  (lark: skipped when missing)

    from radixrt.runtime.constrained.cfg_regex import cfg_regex

    auto = Engine(dtype="float32")
    try:
        cases = []
        for name, (gbnf, lark_text) in GRAMMARS.items():
            # outlines, cached once compiled
            shadow = auto.scheduler.grammar_backend("ebnf").secondary
            fut = shadow.request("regex", cfg_regex(gbnf))
            while not fut.done():
                time.sleep(0.01)
            state = fut.result()
            # the subset's shortest completion
            k = state.compiled.steering.dist[state.guide.get_state()]
            cases += [(name, gbnf, lark_text, k, b) for b in (k - 1, k, k + 2, 2 * k + 4) if b > 0]
        outs = auto.generate(
            [f"Write a very long example of {name} text:" for name, *_ in cases],
            [{"ebnf": g, "temperature": 0, "max_new_tokens": b} for _, g, _, _, b in cases],
        )
        fitted = 0
        for (name, _gbnf, lark_text, k, budget), out in zip(cases, outs):
            meta = out["meta_info"]
            if budget < k:  # nothing complete fits
                assert meta.get("incomplete") and meta["finish_reason"]["type"] == "length", (
                    name,
                    out["text"],
                )
                continue
            assert not meta.get("incomplete"), (name, budget, out["text"])
            lark.Lark(lark_text, parser="earley").parse(out["text"])
            fitted += meta["completion_tokens"] == budget
        assert fitted >= 2, "no output needed its whole budget: steering was not exercised"
        auto.check_integrity()
    finally:
        auto.shutdown()
