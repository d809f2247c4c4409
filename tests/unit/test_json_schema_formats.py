"""json_schema/formats.py: format names outside JSON Schema's vocabulary are dropped before llguidance.
Truth: the `jsonschema` validator with format checking judges every value the same on the original and the
rewritten schema (it ignores unknown formats, as the standard says), and llguidance then walks exactly the
strings the validator accepts; standard formats llguidance lacks are still refused."""

from __future__ import annotations

import copy
import json
import time

import pytest
from jsonschema import Draft202012Validator

from radixrt.runtime.constrained.json_schema.formats import without_nonstandard_formats
from radixrt.runtime.constrained.regex_builder import GrammarError

SCHEMA = {
    "type": "object",
    "properties": {
        "blob": {"type": "string", "format": "byte"},
        "format": {"type": "string", "format": "color"},  # a property named like the keyword
        "when": {"type": "string", "format": "date"},
        "tag": {"const": {"format": "byte"}},  # data, not a schema
        "list": {
            "type": "array",
            "items": {"anyOf": [{"type": "string", "format": "int64"}, {"type": "null"}]},
        },
        "ref": {"$ref": "#/$defs/pw"},
    },
    "$defs": {"pw": {"type": "string", "format": "password", "minLength": 2}},
}
VALUES = [
    {"blob": "not base64 !"},
    {"format": "red"},
    {"when": "2024-02-30"},
    {"when": "2024-02-03"},
    {"tag": {"format": "byte"}},
    {"tag": {}},
    {"list": ["x", None, 3]},
    {"ref": "a"},
    {"ref": "ab"},
]


def valid(schema, value) -> bool:
    return Draft202012Validator(
        schema, format_checker=Draft202012Validator.FORMAT_CHECKER
    ).is_valid(value)


def test_only_nonstandard_formats_go_and_the_validator_agrees():
    before = copy.deepcopy(SCHEMA)
    out = without_nonstandard_formats(SCHEMA)
    assert SCHEMA == before, "the input is not mutated"
    props = out["properties"]
    assert (
        "format" not in props["blob"]
        and "format" not in props["format"]
        and "format" not in out["$defs"]["pw"]
    )
    assert props["when"]["format"] == "date" and props["tag"] == {"const": {"format": "byte"}}
    assert "format" not in props["list"]["items"]["anyOf"][0]
    for value in VALUES:
        assert valid(out, value) == valid(SCHEMA, value), value


@pytest.fixture(scope="module")
def llg(tokenizer):
    pytest.importorskip("llguidance")
    from radixrt.runtime.constrained.llg_backend import LLGuidanceBackend

    backend = LLGuidanceBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield backend
    backend.shutdown()


def accepts(llg, tokenizer, schema, value) -> bool:
    future = llg.request("json_schema", json.dumps(schema))
    while not future.done():
        time.sleep(0.005)
    state = future.result()
    text = json.dumps(value, separators=(",", ":"))
    for tok in tokenizer.encode(text, add_special_tokens=False):
        try:
            state.accept(tok)
        except GrammarError:
            return False
    return state.is_final()


def test_llguidance_serves_a_nonstandard_format_as_any_string(llg, tokenizer):
    schema = {
        "type": "object",
        "properties": {"blob": {"type": "string", "format": "byte"}},
        "required": ["blob"],
    }
    llg.validate("json_schema", json.dumps(schema))  # refused before ("Unknown format: byte")
    for value in ({"blob": "aGk="}, {"blob": "not base64 !"}, {"blob": 3}):
        assert accepts(llg, tokenizer, schema, value) == valid(schema, value), value


def test_a_standard_format_llguidance_lacks_is_still_refused(llg):
    with pytest.raises(GrammarError, match="uri-template"):
        llg.validate("json_schema", json.dumps({"type": "string", "format": "uri-template"}))
