"""The grammar of tool calls in the fallback (Hermes-style) format, as a regex on the output text.

A call is `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>` where NAME is one of the
request's tools and ARGS matches that tool's parameter schema (json_schema/to_regex.py enforces it);
parallel calls follow each other separated by a newline. `opened`: the text starts after an opening
`<tool_call>` the model wrote itself (tool_choice auto: free text until the model opens a call, then
this grammar). serving/openai_api/tool_calls.py renders the same format into prompts;
serving/openai_api/tool_parsers/ reads it back. The spec is plain JSON so it keys the grammar cache
and crosses into compile workers.
"""

from __future__ import annotations

import json
from typing import Any

from radixrt.runtime.constrained.json_schema.to_regex import schema_to_regex
from radixrt.runtime.constrained.regex_builder import GrammarError

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
ARGS_POINTER = "#/properties/arguments"  # where a tool's parameter schema sits in its call's schema
_DATA_KEYWORDS = ("enum", "const", "default", "examples")  # values, not schemas: never rewritten
_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def tool_call_spec(tools: list[tuple[str, dict]], parallel: bool, opened: bool) -> str:
    """The canonical spec string of a tool_call_grammar constraint. Keys keep their order: a
    schema's declared property order is the order its arguments are written in, as OpenAI's strict
    mode and the json_schema constraint write them."""
    return json.dumps(
        {
            "tools": [{"name": n, "parameters": p} for n, p in tools],
            "parallel": parallel,
            "opened": opened,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def tool_call_regex(spec: Any) -> str:
    """GrammarError when the spec is malformed or a parameter schema cannot be enforced."""
    if not isinstance(spec, dict) or not isinstance(spec.get("tools"), list) or not spec["tools"]:
        raise GrammarError("tool_call_grammar needs a non-empty list of tools")
    bodies = []
    for tool in spec["tools"]:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise GrammarError("every tool of tool_call_grammar needs a name")
        call = {
            "type": "object",
            "properties": {
                "name": {"const": tool["name"]},
                "arguments": _rebased(tool.get("parameters") or {"type": "object"}, ARGS_POINTER),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        bodies.append(schema_to_regex(call))
    body = bodies[0] if len(bodies) == 1 else "(?:" + "|".join(bodies) + ")"
    rest = rf"\n{body}\n{CLOSE}"
    first = rest if spec.get("opened") else OPEN + rest
    return first + rf"(?:\n{OPEN}{rest})*" if spec.get("parallel") else first


def _rebased(node: Any, pointer: str) -> Any:
    """A parameter schema's local $refs (`#`, `#/$defs/...`: pydantic's, instructor's, ...) made
    to point into the call schema it is nested in at `pointer`: the schema is its own document to
    the client, as OpenAI and SGLang treat it. Anchors and $id names resolve anywhere as they are.
    (Depth is bounded before this runs: spec.check_schema_size.)"""
    if isinstance(node, list):
        return [_rebased(v, pointer) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):
            out[k] = pointer + v[1:]
        elif k in _DATA_KEYWORDS:
            out[k] = v
        elif k in _NAMED_SCHEMAS and isinstance(v, dict):  # names are not keywords ("$ref", "enum")
            out[k] = {name: _rebased(sub, pointer) for name, sub in v.items()}
        else:
            out[k] = _rebased(v, pointer)
    return out
