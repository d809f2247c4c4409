"""A constraint as the grammar backend keys it, and its regex. No torch: compile workers import
this.

The key is canonical (a JSON schema re-serialised), so equal specs share one compiled grammar.
A schema is bounded before any normalisation runs: nesting depth and node count (a schema that
passes is still compiled under a time and memory limit, compile_pool.py).
"""

from __future__ import annotations

import json
from typing import Any

from radixrt.runtime.constrained.json_schema.to_regex import (
    choices_regex,
    json_object_regex,
    schema_to_regex,
)
from radixrt.runtime.constrained.pattern import check_user_regex
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.tool_call_regex import tool_call_regex

KINDS = ("regex", "json_schema", "choices", "json_object", "tool_call_grammar", "ebnf")
# context-free: only a backend with CFG support (llguidance) can enforce these
CFG_KINDS = ("ebnf",)
JSON_OBJECT_DEPTH = 2  # nesting levels of a response_format json_object (outer object included)
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 10_000


def check_schema_size(schema: Any) -> None:
    """GrammarError when the schema document nests deeper than MAX_SCHEMA_DEPTH or has more than
    MAX_SCHEMA_NODES objects and arrays."""
    stack, nodes = [(schema, 1)], 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            nodes += 1
            if depth > MAX_SCHEMA_DEPTH:
                raise GrammarError(f"json_schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
            if nodes > MAX_SCHEMA_NODES:
                raise GrammarError(
                    f"json_schema has more than {MAX_SCHEMA_NODES} objects and arrays"
                )
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth + 1) for c in children)


def grammar_key(kind: str, spec: Any) -> tuple:
    if kind not in KINDS:
        raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "json_schema":
        if isinstance(spec, (str, bytes)):
            try:
                spec = json.loads(spec)
            except (ValueError, RecursionError) as e:
                raise GrammarError(f"json_schema is not valid JSON: {e}") from None
        check_schema_size(spec)
        try:
            return kind, json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise GrammarError(f"json_schema is not JSON-serialisable: {e}") from None
    if kind == "choices":
        if (
            not isinstance(spec, (list, tuple))
            or not spec
            or not all(isinstance(c, str) for c in spec)
        ):
            raise GrammarError("choices must be a non-empty list of strings")
        return kind, tuple(spec)
    if kind == "regex":
        if not isinstance(spec, str):
            raise GrammarError("regex must be a string")
        return kind, spec
    if kind == "ebnf":
        if not isinstance(spec, str) or not spec.strip():
            raise GrammarError("ebnf must be a non-empty grammar string")
        return kind, spec
    if kind == "tool_call_grammar":
        try:
            parsed = json.loads(spec) if isinstance(spec, (str, bytes)) else spec
        except (ValueError, RecursionError) as e:
            raise GrammarError(f"tool_call_grammar is not valid JSON: {e}") from None
        check_schema_size(parsed)
        # keys keep their order: it is the order of the call's arguments (tool_call_regex.py)
        return kind, json.dumps(parsed, ensure_ascii=False, separators=(",", ":"))
    return kind, None


def spec_regex(key: tuple) -> str:
    """The regex a key's grammar enforces; GrammarError for anything that cannot be enforced."""
    kind, spec = key
    if kind == "regex":
        check_user_regex(spec)
        return spec
    if kind == "json_schema":
        return schema_to_regex(json.loads(spec))
    if kind == "choices":
        return choices_regex(list(spec))
    if kind == "tool_call_grammar":
        return tool_call_regex(json.loads(spec))
    if kind in CFG_KINDS:
        raise GrammarError(
            f"{kind} is a context-free grammar: it needs the llguidance backend "
            "(pip install llguidance)"
        )
    return json_object_regex(JSON_OBJECT_DEPTH)
