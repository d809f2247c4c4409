"""The grammar of tool calls in the fallback (Hermes-style) format, as a regex on the output text.

A call is `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>` where NAME is one of the
request's tools and ARGS matches that tool's parameter schema (json_schema/to_regex.py enforces it);
parallel calls follow each other separated by a newline. `opened`: the text starts after an opening
`<tool_call>` the model wrote itself (tool_choice auto: free text until the model opens a call, then
this grammar). serving/tool_calls.py renders the same format into prompts;
serving/tool_call_parser.py reads it back. The spec is plain JSON so it keys the grammar cache and
crosses into compile workers.
"""

from __future__ import annotations

import json
from typing import Any

from radixrt.runtime.constrained.json_schema.to_regex import schema_to_regex
from radixrt.runtime.constrained.regex_builder import GrammarError

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def tool_call_spec(tools: list[tuple[str, dict]], parallel: bool, opened: bool) -> str:
    """The canonical spec string of a tool_call_grammar constraint."""
    return json.dumps(
        {
            "tools": [{"name": n, "parameters": p} for n, p in tools],
            "parallel": parallel,
            "opened": opened,
        },
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
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
                "arguments": tool.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        bodies.append(schema_to_regex(call))
    body = bodies[0] if len(bodies) == 1 else "(?:" + "|".join(bodies) + ")"
    rest = rf"\n{body}\n{CLOSE}"
    first = rest if spec.get("opened") else OPEN + rest
    return first + rf"(?:\n{OPEN}{rest})*" if spec.get("parallel") else first
