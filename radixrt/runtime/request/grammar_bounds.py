"""What a json_schema or an ebnf grammar costs, read before any automaton is built (#56.8): the
bound of a regex constraint (regex_bounds.py) applied to the regexes and the counts inside them.

llguidance builds a lexeme's automaton lazily, in the scheduler's step: a schema whose string
`pattern` was ((a{99}){99}){99} cost 1.7 s of the first mask (no other request stepped, /health
waited), and a Lark grammar's /((a{99}){99}){99}/ terminal the same. So every regex a schema holds
(`pattern`, the keys of `patternProperties`) and every regex literal of a grammar must pass
check_regex_expansion, and every count a schema or a grammar states (minLength .. maxContains, a
repeat's {m,n} or ~ m..n) is at most MAX_REGEX_EXPANSION: no output that long fits a context anyway.
One pass over the parsed schema, one over the grammar's text. What is left is bounded per step by
llguidance's parser limits, set explicitly (llg_backend.PARSER_LIMITS).
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixrt.runtime.request.regex_bounds import MAX_REGEX_EXPANSION, check_regex_expansion

# the JSON Schema keywords that count characters, items or properties
COUNT_KEYWORDS = frozenset(
    {
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minContains",
        "maxContains",
    }
)
# a repeat in GBNF ({m}, {m,}, {m,n}) or Lark (~ m, ~ m..n)
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}|~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
# a Lark regex literal: /.../ with its flags (escaped slashes inside)
_REGEX_LITERAL = re.compile(r"/((?:[^/\\\n]|\\.)+)/[imslux]*")
_STRING_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def check_schema_bounds(schema_text: str) -> None:
    """ValueError naming json_schema when a pattern in it expands past MAX_REGEX_EXPANSION or a
    count is larger than that (also run on the JSON of tool_call_grammar and structural_tag, whose
    parameters are schemas). Text that is not JSON is left to the backends' own refusal."""
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError):
        return
    stack = [schema]
    while stack:  # iterative: a deep schema cannot exhaust the stack
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in COUNT_KEYWORDS and isinstance(value, (int, float)) and not _small(value):
                raise ValueError(
                    f"sampling parameter json_schema is too large: {key} is {value}, at most "
                    f"{MAX_REGEX_EXPANSION}"
                )
            if key == "pattern" and isinstance(value, str):
                check_regex_expansion(value, "json_schema", "pattern")
            if key == "patternProperties" and isinstance(value, dict):
                for regex in value:
                    check_regex_expansion(regex, "json_schema", "patternProperties key")
            if isinstance(value, (dict, list)):
                stack.append(value)


def check_grammar_bounds(grammar: str, param: str = "ebnf") -> None:
    """ValueError naming param when a repeat count in the grammar is larger than
    MAX_REGEX_EXPANSION or one of its regex literals expands past it."""
    for m in _REPEAT.finditer(grammar):
        # a count of more digits than any bound is past it (and int() of thousands of digits is
        # refused by Python itself, without naming the field)
        counts = [int(g) if len(g) <= 9 else MAX_REGEX_EXPANSION + 1 for g in m.groups() if g]
        if counts and max(counts) > MAX_REGEX_EXPANSION:
            raise ValueError(
                f"sampling parameter {param} is too large: the repeat {m.group(0)!r} counts past "
                f"{MAX_REGEX_EXPANSION}"
            )
    # a string literal may hold a slash: regexes are looked for outside them
    for m in _REGEX_LITERAL.finditer(_STRING_LITERAL.sub('""', grammar)):
        check_regex_expansion(m.group(1), param, "regex literal")


def check_spec_bounds(p: Any) -> None:
    """The constraint specs of sampling parameters p (each already of bounded size)."""
    if p.regex is not None:  # cheap: one walk over its parse
        check_regex_expansion(p.regex)
    for text in (p.json_schema, p.tool_call_grammar, p.structural_tag):
        if isinstance(text, str):  # the tools' and tags' parameters are schemas too
            check_schema_bounds(text)
    if p.ebnf is not None:
        check_grammar_bounds(p.ebnf)


def _small(count: int | float) -> bool:
    return count <= MAX_REGEX_EXPANSION
