"""oneOf = anyOf only when no value we generate matches two branches.

A regex alternation admits a value that satisfies several branches, which oneOf forbids. We
prove, pair by pair, that every value generated for branch A fails branch B (as a validator):
disjoint types, a literal set that B rejects, a key B requires that A never writes or writes
only with values B rejects (recursively), a key A always writes with values B rejects,
property counts B refuses.
When no proof is found the schema is rejected rather than risking a doubly-matching value.
"""

from __future__ import annotations

import re

from radixrt.runtime.constrained.json_schema.normalize import (
    ANNOTATIONS,
    TYPES,
    literal_type,
    schema_types,
)

MAX_PROOF_DEPTH = 4


def check_one_of(c, branches: list, refs: tuple[str, ...]) -> tuple[int, int] | None:
    """(i, j) of two branches that may share a generated value, or None when all are disjoint."""
    norm = [c.normalized(b, refs) for b in branches]
    for i, a in enumerate(norm):
        for j, b in enumerate(norm):
            if i != j and a is not False and b is not False and not excludes(c, a, b, refs, 0):
                return i, j
    return None


def _branches(c, s: dict, refs) -> list | None:
    for comb in ("anyOf", "oneOf"):
        if comb in s:
            siblings = {k: v for k, v in s.items() if k not in (comb, *ANNOTATIONS)}
            return [
                c.normalized({"allOf": [siblings, b]} if siblings else b, refs) for b in s[comb]
            ]
    return None


def _rule_for(b: dict, key: str):
    """What validator b demands of the value of `key`."""
    if key in (b.get("properties") or {}):
        return b["properties"][key]
    matched = [
        sub for pat, sub in (b.get("patternProperties") or {}).items() if re.search(pat, key)
    ]
    if matched:
        return {"allOf": matched}
    return b.get("additionalProperties", True)


def excludes(c, a, b, refs, depth: int) -> bool:
    """True if no value generated for normalised schema `a` validates against normalised `b`."""
    if a is False or b is False:
        return True
    if depth > MAX_PROOF_DEPTH or b == {}:
        return False
    if "enum" in a:
        return not any(c.check_literal(v, b) for v in a["enum"])
    a_branches = _branches(c, a, refs)
    if a_branches is not None:
        return all(excludes(c, x, b, refs, depth + 1) for x in a_branches)
    b_branches = _branches(c, b, refs)
    if b_branches is not None:
        return all(excludes(c, a, y, refs, depth + 1) for y in b_branches)
    generated = schema_types(a) or set(TYPES)
    if "number" in generated:
        generated = generated | {"integer"}
    if "type" in b:
        accepted = set(schema_types(b) or TYPES)
        if "number" in accepted:
            accepted.add("integer")
        if not generated & accepted:
            return True
    if "enum" in b:
        literal_types = {literal_type(v) for v in b["enum"]}
        if not generated & (literal_types | ({"number"} if "integer" in literal_types else set())):
            return True
    if generated != {"object"}:
        return False
    return _objects_exclude(c, a, b, refs, depth)


def _objects_exclude(c, a: dict, b: dict, refs, depth: int) -> bool:
    a_props, a_req = a.get("properties") or {}, a.get("required") or []
    is_map = not a_props and not a_req and a.get("additionalProperties", True) is not False
    # a closed object writes only these keys; a map may write any key
    written = None if is_map else set(a_props) | set(a_req)
    if written is not None:
        if "maxProperties" in b and len(set(a_req)) > b["maxProperties"]:
            return True
        if "minProperties" in b and len(written) < b["minProperties"]:
            return True

    def value_excluded(key: str) -> bool:
        rule = _rule_for(b, key)
        if rule is False:
            return True
        if rule is True or rule == {}:
            return False
        a_value = a_props[key] if key in a_props else _rule_for(a, key)
        return excludes(c, c.normalized(a_value, refs), c.normalized(rule, refs), refs, depth + 1)

    # a key b requires: either a never writes it, or whatever a writes there b rejects
    for key in b.get("required") or []:
        if (written is not None and key not in written) or value_excluded(key):
            return True
    # a key a always writes whose values b rejects
    return any(value_excluded(key) for key in a_req)
