"""#35: under every grammar backend, a constrained request whose budget admits a valid completion returns valid
output, in a batch with other schemas, however late the steering DFA (the outlines shadow of a request llguidance
serves) arrives. The shadow's compile is delayed here on purpose (as a busy compile pool delays it): a request
waits for its steering instead of decoding past the point where a valid ending still fits. Truth: `jsonschema`
on the output; each budget is checked to admit a completion (the shadow DFA's shortest distance). The model is
the tiny random Llama with the default tokenizer: the guarantee holds for any model, and a random model runs
into its budget as readily as the prompts ask the real one to."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from radixrt import Engine
from radixrt.runtime.constrained import fallback

TIGHT = [  # (schema, max_new_tokens): a valid ending fits, but not if the model writes its long value first
    (
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        16,
    ),
    (
        {
            "type": "object",
            "properties": {"s": {"type": "string"}},
            "required": ["s"],
            "additionalProperties": False,
        },
        20,
    ),
    (
        {
            "type": "object",
            "properties": {"xs": {"type": "array", "items": {"type": "number"}}},
            "required": ["xs"],
            "additionalProperties": False,
        },
        24,
    ),
    (
        {
            "type": "object",
            "properties": {
                "id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]}
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        16,
    ),
    (
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                "required": ["k", "v"],
                "additionalProperties": False,
            },
        },
        40,
    ),
]
ORDINARY = [
    (
        {
            "type": "object",
            "properties": {
                f"name{i}": {"type": "string", "maxLength": 20},
                "age": {"type": "integer"},
            },
            "required": [f"name{i}", "age"],
            "additionalProperties": False,
        },
        48,
    )
    for i in range(3)
]
SHADOW_DELAY_S = 4.0  # longer than the tight requests take to decode unsteered


class LateFuture:
    """A compile future that reports done only SHADOW_DELAY_S after it was asked for."""

    def __init__(self, inner):
        self.inner, self.ready_at = inner, time.monotonic() + SHADOW_DELAY_S

    def done(self):
        return time.monotonic() >= self.ready_at and self.inner.done()

    def result(self):
        return self.inner.result()


def prompt(tokenizer, schema) -> str:
    return tokenizer.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Write a long JSON value with many digits and "
                "characters for this schema: " + json.dumps(schema),
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )


@pytest.mark.parametrize("backend", ["auto", "llguidance", "outlines"])
def test_budget_valid_json_in_a_batch_with_late_steering(backend, monkeypatch, tiny_model_dir):
    real = fallback.FallbackBackend.shadow_for
    monkeypatch.setattr(
        fallback.FallbackBackend,
        "shadow_for",
        lambda self, kind, spec: (lambda f: f and LateFuture(f))(real(self, kind, spec)),
    )
    engine = Engine(model_path=tiny_model_dir, dtype="float32", grammar_backend=backend)
    try:
        cases = TIGHT + ORDINARY
        outs = engine.generate(
            [prompt(engine.tokenizer, s) for s, _ in cases],
            [
                {"temperature": 0, "max_new_tokens": b, "json_schema": json.dumps(s)}
                for s, b in cases
            ],
        )
        invalid = []
        for (schema, budget), out in zip(cases, outs):
            try:
                jsonschema.validate(json.loads(out["text"]), schema)
            except (ValueError, jsonschema.ValidationError):
                invalid.append((budget, out["text"], out["meta_info"]["finish_reason"]))
        assert not invalid, invalid
        engine.scheduler.check_integrity()
    finally:
        engine.shutdown()


NESTED_DIGITS = 'root ::= list\nlist ::= "[" (item ("," item)*)? "]"\nitem ::= [0-9] | list'
NESTED_DIGITS_LARK = (
    'start: list\nlist: "[" (item ("," item)*)? "]"\nitem: DIGIT | list\nDIGIT: /[0-9]/'
)


@pytest.mark.parametrize("backend", ["auto", "llguidance"])
def test_recursive_grammar_closes_inside_its_budget(backend, tiny_model_dir):
    """#35.4: a prompt that invites nesting nine deep, budgets too small for that: the output must close. Truth:
    lark's own parser of the same grammar."""
    import lark

    parser = lark.Lark(NESTED_DIGITS_LARK)
    engine = Engine(model_path=tiny_model_dir, dtype="float32", grammar_backend=backend)
    try:
        tok = engine.tokenizer
        prompts = [
            tok.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
            for q in (
                "Continue the pattern: [1,[2,[3,[4,[5,[6,[7,[8,[9]]]]]]]]] and [1,[2,[3,[4,[5,[6,[7,"
                "[8,[9]]]]]]]]] and",
                "Write a long nested list of lists of digits.",
            )
        ]
        for budget in (20, 12):
            for out in engine.generate(
                prompts, {"temperature": 0, "max_new_tokens": budget, "ebnf": NESTED_DIGITS}
            ):
                parser.parse(out["text"])  # raises on an unclosed or malformed list
                assert out["meta_info"]["finish_reason"]["type"] == "stop"
        engine.scheduler.check_integrity()
    finally:
        engine.shutdown()
