"""Requests as the client libraries send them (instructor, LangChain, pydantic-ai; recorded from their
own HTTP clients against a real server, tests/integration/test_client_libraries.py), taken apart
without a server: the grammar a tool call is held to when the tool's parameters are a pydantic
model's JSON schema, with $defs and $ref."""

from __future__ import annotations

import json
import re

import pytest
from client_models import Person
from pydantic import BaseModel, Field

from radixrt.runtime.constrained.spec import grammar_key, spec_regex
from radixrt.runtime.serving.openai_api.tool_calls import plan_tools


class Node(BaseModel):
    """Recursive: pydantic's schema is {"$defs": {"Node": ...}, "$ref": "#/$defs/Node"}."""

    label: str = Field(max_length=8)
    children: list[Node] = Field(default_factory=list, max_length=2)


def call_regex(parameters: dict, tool_choice: object = "required") -> str:
    """The regex the server holds a call to tool `f` to, by the server's own path."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    plan = plan_tools(tools, tool_choice, parallel=False)
    return spec_regex(grammar_key("tool_call_grammar", plan.grammar(opened=False)))


def call(args: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'f', 'arguments': args}, separators=(',', ':'))}\n</tool_call>"


def test_tool_parameters_with_defs_and_refs_are_their_own_document():
    # instructor's Mode.TOOLS and pydantic-ai's output tool send the model's schema as it is
    schema = Person.model_json_schema()
    assert schema["properties"]["address"] == {"$ref": "#/$defs/Address"}
    rx = call_regex(schema, {"type": "function", "function": {"name": "f"}})
    good = {"name": "John", "age": 30, "address": {"street": "1 Main St", "city": "Boston"}}
    assert re.fullmatch(rx, call(good))
    # the referenced definition is enforced, not skipped
    assert not re.fullmatch(rx, call({**good, "address": {"street": "1 Main St"}}))
    assert not re.fullmatch(rx, call({**good, "address": {"street": "x", "city": "y" * 21}}))


def test_recursive_and_root_refs_resolve():
    schema = Node.model_json_schema()
    assert schema["$ref"] == "#/$defs/Node"
    rx = call_regex(schema)
    tree = {"label": "a", "children": [{"label": "b", "children": []}]}
    assert re.fullmatch(rx, call(tree))
    assert not re.fullmatch(rx, call({"label": "a", "children": [{"children": []}]}))
    whole = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "again": {"$ref": "#"}},
        "required": ["x"],
    }
    assert re.fullmatch(call_regex(whole), call({"x": 1, "again": {"x": 2}}))


@pytest.mark.parametrize("name", ["$ref", "enum", "const"])
def test_property_names_that_are_keywords_are_names(name):
    # a property's name is not a keyword: the schema under it is rebased like any other
    schema = {
        "$defs": {"N": {"type": "integer", "maximum": 9}},
        "type": "object",
        "properties": {name: {"$ref": "#/$defs/N"}},
        "required": [name],
    }
    rx = call_regex(schema)
    assert re.fullmatch(rx, call({name: 7})) and not re.fullmatch(rx, call({name: 70}))


def test_values_that_look_like_refs_are_data():
    # enum / const / default values are data: a "$ref" inside one is not rewritten
    ref = {"$ref": "#/$defs/N"}
    schema = {"type": "object", "properties": {"v": {"enum": [ref]}}, "required": ["v"]}
    assert re.fullmatch(call_regex(schema), call({"v": ref}))


def test_arguments_come_in_the_declared_order():
    # as OpenAI's strict mode and the json_schema constraint write them: a model extracts `name`
    # before `address` when the schema asks so (sorted keys had put `address` first)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    rx = call_regex(schema)
    assert re.fullmatch(rx, call({"name": "J", "age": 3}))
    assert not re.fullmatch(rx, call({"age": 3, "name": "J"}))
