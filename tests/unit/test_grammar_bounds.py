"""#56.8: the counts and regexes inside a json_schema, a tool or structural tag's schemas and an ebnf
grammar are bounded at the edge like a regex constraint (grammar_bounds.py), and llguidance's parser
limits are explicit so what reaches its lazy lexer in the step gives up in bounded CPU. Truths: the
regex expansion of regex_bounds (itself held to interegular), every schema of the constrained suites
passing (no false refusal), and llguidance's own error state."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from radixrt.runtime.request.grammar_bounds import check_grammar_bounds, check_schema_bounds
from radixrt.runtime.request.regex_bounds import MAX_REGEX_EXPANSION
from radixrt.runtime.request.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from test_json_schema_regex import SUITE  # noqa: E402

NESTED = "((a{99}){99}){99}"  # 970,299 positions written out
BIG = MAX_REGEX_EXPANSION + 1

HOSTILE_SCHEMAS = {
    "pattern": {"type": "string", "pattern": f"^{NESTED}$"},
    "minLength": {"type": "string", "minLength": 300_000},
    "maxItems deep": {
        "type": "object",
        "properties": {"a": {"anyOf": [{"type": "array", "items": {}, "minItems": BIG}]}},
    },
    "patternProperties": {"type": "object", "patternProperties": {NESTED: {"type": "string"}}},
    "in a list": {"allOf": [{"type": "object"}, {"properties": {"x": {"maxLength": 10**9}}}]},
}


@pytest.mark.parametrize("name", HOSTILE_SCHEMAS)
def test_hostile_schemas_are_refused_naming_json_schema(name):
    with pytest.raises(ValueError, match="sampling parameter json_schema is too large"):
        check_schema_bounds(json.dumps(HOSTILE_SCHEMAS[name]))
    with pytest.raises(ValueError, match="json_schema"):
        SamplingParams(json_schema=json.dumps(HOSTILE_SCHEMAS[name])).validate()


def test_every_suite_schema_passes_and_the_bound_itself_passes():
    for schema, *_rest in SUITE.values():
        check_schema_bounds(json.dumps(schema))  # raises on a false refusal
    check_schema_bounds(json.dumps({"type": "string", "maxLength": MAX_REGEX_EXPANSION}))
    check_schema_bounds(json.dumps({"properties": {"pattern": {"type": "string"}}}))  # a name
    check_schema_bounds("not json")  # left to the backends' own refusal


def test_schemas_inside_tools_and_tags_are_walked():
    tools = [{"name": "f", "parameters": {"properties": {"s": {"pattern": NESTED}}}}]
    with pytest.raises(ValueError, match="tool_call_grammar|json_schema"):
        SamplingParams(tool_call_grammar=json.dumps(tools)).validate()


@pytest.mark.parametrize(
    "grammar",
    [
        f'root ::= "a"{{{BIG}}}',
        f"root ::= [0-9]{{1,{BIG}}}",
        f"start: /{NESTED}/",
        f'start: "x" ~ {BIG}',
        f'start: item ~ 1..{BIG}\nitem: "a"',
        'root ::= "a"{' + "9" * 20_000 + "}",  # more digits than Python's int() reads
    ],
)
def test_hostile_grammars_are_refused_naming_ebnf(grammar):
    with pytest.raises(ValueError, match="sampling parameter ebnf is too large"):
        check_grammar_bounds(grammar)
    with pytest.raises(ValueError, match="ebnf"):
        SamplingParams(ebnf=grammar).validate()


def test_plain_grammars_pass_and_slashes_in_strings_are_not_regexes():
    check_grammar_bounds('root ::= "yes" | "no"')
    check_grammar_bounds('root ::= [a-z]{1,40} "@" [a-z]{2,30}')
    check_grammar_bounds('start: /[0-9]{3}-[0-9]{4}/ "/" WORD\nWORD: /[a-z]+/')
    check_grammar_bounds(f'root ::= "a/{NESTED}/b"')  # inside a string: text, not a regex


def test_llguidance_gives_up_on_an_explosive_lexeme_in_bounded_cpu(tokenizer):
    """What gets past the edge (here: the schema handed to the backend directly) meets the explicit
    lexer fuel: the first mask costs a fraction of a second of this thread's CPU (0.06 s; 0.9 to
    1.6 s with llguidance's default fuel, in the scheduler's step) and the lexeme it cannot build
    ends the grammar with an error instead of being served."""
    import torch

    from radixrt.runtime.constrained.llg_backend import LLGuidanceBackend
    from radixrt.runtime.constrained.regex_builder import GrammarError

    backend = LLGuidanceBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    try:
        future = backend.request("json_schema", json.dumps(HOSTILE_SCHEMAS["pattern"]))
        while not future.done():  # built on the backend's thread (in microseconds: lazily)
            time.sleep(0.01)
        state = future.result()
        words = torch.zeros(backend.num_words, dtype=torch.int32)
        cpu = time.thread_time()  # the first mask: the string's lexeme, pattern and all
        state._write_allowed(words)
        spent = time.thread_time() - cpu
        assert spent < 0.4, spent
        quote = tokenizer.encode('"', add_special_tokens=False)[0]
        with pytest.raises(GrammarError):
            state._advance(quote)
        assert state.matcher.is_error()
    finally:
        backend.shutdown()
