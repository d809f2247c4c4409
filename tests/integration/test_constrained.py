"""Constrained decoding on the real default model through Engine.generate, greedy.

Truths: `jsonschema` (format checker on) validates every JSON output; `re.fullmatch` judges
regex outputs; choices must come back verbatim; jump-forward on vs off must give identical
token ids (and jump-forward must actually have fired, seen as tokens without a logprob).
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from radixrt import Engine

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_json_schema_regex import SUITE, validator  # noqa: E402

MAX_NEW_TOKENS = 160
# Schemas whose every value is bounded (enums, numbers, short strings, small arrays) or
# typical of extraction tasks; the model writes them within MAX_NEW_TOKENS.
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"}}, "required": ["name", "age", "email"], "additionalProperties": False},
    "weather": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
        "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]}, "date": {"type": "string", "format": "date"}},
        "required": ["city", "temperature_c", "conditions", "date"]},
    "todo_list": {"type": "object", "properties": {"items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
        "type": "object", "properties": {"task": {"type": "string", "maxLength": 25}, "done": {"type": "boolean"}},
        "required": ["task", "done"]}}}, "required": ["items"]},
    "event": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}, "starts": {"type": "string", "format": "date-time"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["id", "starts", "priority"]},
    "shape": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}},
         "required": ["kind", "radius"]},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 100}},
         "required": ["kind", "side"]}]},
    "nullable_choice": {"type": "object", "properties": {"answer": {"anyOf": [{"enum": ["yes", "no"]}, {"type": "null"}]},
                                                         "score": {"type": "number", "minimum": 0, "maximum": 1}},
                        "required": ["answer", "score"]},
    "review": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                                "keywords": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
               "required": ["sentiment", "stars", "keywords"]},
}
# from the unit suite: all of these keep strings short or absent
SUITE_NAMES = ["array_bounds", "enum_mixed", "int_bounds", "number_exclusive", "multiple_of", "tuple_2020",
               "defs_ref", "allof_merge", "unicode_keys", "map_values", "const", "dependent_required"]


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def engine():
    eng = Engine(grammar_compile_timeout=120.0)
    yield eng
    eng.shutdown()


def run_schemas(engine, schemas: dict, **extra):
    prompts = [chat(engine.tokenizer, f"Reply with a JSON object for this schema:\n{json.dumps(s)}") for s in schemas.values()]
    params = [{"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, **extra} for s in schemas.values()]
    return engine.generate(prompts, params, return_logprob=True)


def test_schemas_give_valid_json(engine):
    schemas = {**SCHEMAS, **{n: SUITE[n][0] for n in SUITE_NAMES}}
    outs = run_schemas(engine, schemas)
    for (name, schema), out in zip(schemas.items(), outs):
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "stop", f"{name}: did not finish within {MAX_NEW_TOKENS} tokens: {out['text']!r}"
        value = json.loads(out["text"])
        errors = [e.message for e in validator(schema).iter_errors(value)]
        assert not errors, f"{name}: {out['text']!r} violates the schema: {errors}"


def test_jump_forward_on_equals_off(engine):
    off_engine = Engine(enable_jump_forward=False, grammar_compile_timeout=120.0)
    try:
        picked = {k: SCHEMAS[k] for k in ("weather", "shape", "review", "event")}
        on = run_schemas(engine, picked)
        off = run_schemas(off_engine, picked)
    finally:
        off_engine.shutdown()
    num_forced = 0
    for name, a, b in zip(picked, on, off):
        assert a["output_ids"] == b["output_ids"], f"{name}: jump-forward changed greedy output"
        num_forced += sum(lp is None for lp, _, _ in a["meta_info"]["output_token_logprobs"])
        assert all(lp is not None for lp, _, _ in b["meta_info"]["output_token_logprobs"])
    assert num_forced > 0, "jump-forward never fired, so the equality says nothing"


def test_regex_and_choices(engine):
    tok = engine.tokenizer
    regexes = [r"[0-9]{3}-[0-9]{3}-[0-9]{4}", r"(January|February|March) [1-9], 20[0-9]{2}", r"[A-Z][a-z]+ is [a-z]+\."]
    outs = engine.generate([chat(tok, "Give me a phone number."), chat(tok, "When is the meeting?"),
                            chat(tok, "Describe Paris in three words.")],
                           [{"regex": rx, "temperature": 0, "max_new_tokens": 40} for rx in regexes])
    for rx, out in zip(regexes, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop" and re.fullmatch(rx, out["text"]), (rx, out["text"])
    choices = ["Paris", "London", "東京", "São Paulo"]
    out = engine.generate(chat(tok, "What is the capital of France?"),
                          {"choices": choices, "temperature": 0, "max_new_tokens": 10})
    assert out["text"] in choices


def test_bad_constraints_are_refused_quickly(engine):
    start = time.perf_counter()
    for params in ({"json_schema": '{"type": "array", "uniqueItems": true}'}, {"json_schema": "{not json"},
                   {"regex": "(?<=a)b"}):
        with pytest.raises(ValueError):
            engine.generate("hi", {**params, "max_new_tokens": 4})
    assert time.perf_counter() - start < 5
