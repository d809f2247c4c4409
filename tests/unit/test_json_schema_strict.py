"""json_schema/strict.py: declared keys only where a schema is silent. Truth: the `jsonschema` validator on
the original and the rewritten schema. A value using only declared keys is judged the same by both; a value
with an undeclared key in any object the rewrite touched is rejected; combining schemas are left alone."""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft202012Validator

from radixrt.runtime.constrained.json_schema.strict import declared_keys_only

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "properties": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
        },  # a property named like the keyword
        "tags": {
            "type": "array",
            "items": {"type": "object", "properties": {"t": {"type": "string"}}, "required": ["t"]},
        },
        "pick": {
            "anyOf": [{"type": "object", "properties": {"x": {"type": "number"}}}, {"type": "null"}]
        },
        "node": {"$ref": "#/$defs/node"},
        "open": {
            "type": "object",
            "properties": {"k": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
    },
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}}}},
}

DECLARED = [
    {"name": "a"},
    {
        "name": "a",
        "properties": {"a": 1},
        "tags": [{"t": "x"}],
        "pick": {"x": 1.5},
        "node": {"v": 2},
    },
    {"pick": None, "open": {"k": 1, "extra": "allowed by the schema"}},
    {"tags": [{}]},  # invalid in both: t is required
    {"properties": {"a": "nope"}},  # invalid in both
]
UNDECLARED = [
    {"name": "a", "zzz": 1},
    {"properties": {"a": 1, "b": 2}},
    {"tags": [{"t": "x", "u": 1}]},
    {"pick": {"x": 1, "y": 2}},
    {"node": {"v": 1, "w": 2}},
]


def valid(schema, value) -> bool:
    return Draft202012Validator(schema).is_valid(value)


def test_declared_keys_are_judged_as_before():
    strict = declared_keys_only(NESTED)
    for value in DECLARED:
        assert valid(strict, value) == valid(NESTED, value), value


@pytest.mark.parametrize("value", UNDECLARED)
def test_undeclared_keys_are_refused(value):
    assert valid(NESTED, value) and not valid(declared_keys_only(NESTED), value)


def test_the_input_is_not_mutated_and_explicit_policies_stay():
    before = copy.deepcopy(NESTED)
    strict = declared_keys_only(NESTED)
    assert NESTED == before
    assert strict["properties"]["open"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize(
    "schema,value",
    [
        (
            {"allOf": [{"type": "object", "properties": {"a": {}}}, {"properties": {"b": {}}}]},
            {"a": 1, "b": 2},
        ),
        (
            {
                "properties": {"kind": {"const": "x"}},
                "oneOf": [{"properties": {"x": {}}, "required": ["x"]}],
            },
            {"kind": "x", "x": 1},
        ),
        (
            {
                "$defs": {"B": {"properties": {"b": {}}}},
                "$ref": "#/$defs/B",
                "properties": {"c": {}},
            },
            {"b": 1, "c": 2},
        ),
    ],
)
def test_schemas_combining_keys_are_left_alone(schema, value):
    """Keys of one object declared in two places (allOf, or properties beside oneOf / $ref): closing either
    would refuse the other's, so the schema is left as it is and the value stays valid."""
    assert declared_keys_only(schema) is schema
    assert valid(declared_keys_only(schema), value)


def test_alternative_objects_are_each_closed():
    schema = {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]}
    strict = declared_keys_only(schema)
    assert valid(strict, {"a": 1}) and valid(strict, None) and not valid(strict, {"a": 1, "z": 0})
