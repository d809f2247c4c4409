"""Objects and arrays for to_regex.py: property lists, closed objects, maps, tuples, counts.

Objects with declared properties are generated closed, keys in declaration order: a subset of
what any `additionalProperties` allows, and exactly what `additionalProperties: false` wants.
An object without declared properties (a map) gets generic string keys, each with the
additionalProperties (or matching patternProperties) schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixrt.runtime.constrained import regex_builder as R
from radixrt.runtime.constrained.regex_builder import GrammarError, alt, escape

MAX_LEADING_OPTIONAL = 16  # first-present choices spelled out when no property is required
LEADING_OPTIONAL_BUDGET = 100_000  # regex chars those choices may cost; fewer choices past it


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise GrammarError(f"invalid patternProperties pattern {pattern!r}: {e}") from None


def _dependencies(s: dict) -> tuple[dict[str, list[str]], set[str]]:
    """(name -> names it requires, names that carry a schema dependency)."""
    deps: dict[str, list[str]] = {}
    schema_deps: set[str] = set()
    for key in ("dependentRequired", "dependencies"):
        for name, dep in (s.get(key) or {}).items():
            if isinstance(dep, list):
                deps.setdefault(name, []).extend(dep)
            else:
                schema_deps.add(name)
    return deps, schema_deps


def _closed_body(entries: list[tuple[str, bool]], ws: str, non_empty: bool) -> str:
    sep = f"{ws},{ws}"
    if not entries:
        return ""
    first_req = next((i for i, (_, req) in enumerate(entries) if req), None)
    if first_req is not None:
        out = []
        for i, (rx, req) in enumerate(entries):
            if i < first_req:
                out.append(f"(?:{rx}{sep})?")
            elif i == first_req:
                out.append(rx)
            else:
                out.append(f"{sep}{rx}" if req else f"(?:{sep}{rx})?")
        return "".join(out)
    # All optional: choose the first present property, then optional followers. Spelling out n
    # choices costs ~n copies of the entries, so big objects offer fewer: the first present
    # property is then one of the first k (a subset of the valid objects).
    total = sum(len(rx) + 2 * len(sep) + 6 for rx, _ in entries)
    k = max(1, min(MAX_LEADING_OPTIONAL, LEADING_OPTIONAL_BUDGET // max(total, 1)))
    firsts = []
    for i, (rx, _) in enumerate(entries[:k]):
        firsts.append(rx + "".join(f"(?:{sep}{e})?" for e, _ in entries[i + 1 :]))
    body = alt(firsts)
    return body if non_empty else f"(?:{body})?"


def object_regex(c, s: dict, refs: tuple[str, ...]) -> str | None:
    """An object's regex: a map when no property is declared, else the declared (and required)
    properties in order, closed; None if a required property cannot be written."""
    ws = c.ws
    props, required = s.get("properties") or {}, list(s.get("required") or [])
    addl, patterns = s.get("additionalProperties", True), s.get("patternProperties") or {}
    if not isinstance(props, dict) or not isinstance(patterns, dict):
        raise GrammarError("properties and patternProperties must be objects")
    if not all(isinstance(r, str) for r in required):
        raise GrammarError("required must be a list of strings")
    min_p, max_p = s.get("minProperties", 0), s.get("maxProperties")
    if not props and not required and addl is not False:
        return _map_regex(c, s, refs, addl, patterns, min_p, max_p)
    if not props and not required and patterns:  # additionalProperties: false, keys from patterns
        return _map_regex(c, s, refs, False, patterns, min_p, max_p)

    deps, schema_deps = _dependencies(s)
    required_set = _required_closure(required, deps)
    if schema_deps & required_set:
        raise GrammarError(
            "dependentSchemas / schema dependencies of a required property cannot be enforced"
        )
    entries: list[tuple[str, bool, str]] = []
    for name in list(props) + [r for r in required if r not in props]:
        is_req = name in required_set
        if not is_req and (
            name in schema_deps or any(d not in required_set for d in deps.get(name, []))
        ):
            continue  # optional with unmet dependencies: leave it out (subset)
        value = _property_value(c, s, refs, name, props, patterns, addl)
        if value is None:
            if is_req:
                return None
            continue
        key = escape(json.dumps(name, ensure_ascii=False))
        entries.append((f"{key}{ws}:{ws}{value}", is_req, name))
    entries = _fit_property_counts(entries, min_p, max_p)
    if entries is None:
        return None
    body = _closed_body([(rx, req) for rx, req, _ in entries], ws, non_empty=min_p > 0)
    return f"\\{{{ws}{body}{ws}\\}}"


def _required_closure(required: list[str], deps: dict[str, list[str]]) -> set[str]:
    """The required names and, transitively, those their dependentRequired lists name (a present
    key's dependencies must be present too)."""
    required_set = set(required)
    changed = True
    while changed:
        changed = False
        for name in list(required_set):
            for dep in deps.get(name, []):
                if dep not in required_set:
                    required_set.add(dep)
                    changed = True
    return required_set


def _property_value(
    c, s: dict, refs: tuple[str, ...], name: str, props: dict, patterns: dict, addl: Any
) -> str | None:
    """The regex of property `name`'s value: its declared schema and every patternProperties schema
    its name matches (additionalProperties if none); None if no value can be written or
    propertyNames refuses the name."""
    rules = [props[name]] if name in props else []
    rules += [sub for pat, sub in patterns.items() if _matches(pat, name)]
    if not rules:
        rules = [addl]
    names_ok = "propertyNames" not in s or c.check_literal(name, s["propertyNames"])
    if names_ok and not any(r is False for r in rules):
        return c.value({"allOf": rules} if len(rules) > 1 else rules[0], refs)
    return None


def _fit_property_counts(
    entries: list[tuple[str, bool, str]], min_p: int, max_p: int | None
) -> list[tuple[str, bool, str]] | None:
    """The (regex, required, name) entries made to meet minProperties (optional ones promoted, in
    order) and maxProperties (only the required ones kept if all could exceed it, a subset); None
    if the counts cannot be met."""
    num_req = sum(req for _, req, _ in entries)
    if min_p > num_req:  # promote optional properties, in order, until enough are present
        for i, (rx, req, name) in enumerate(entries):
            if not req and num_req < min_p:
                entries[i], num_req = (rx, True, name), num_req + 1
        if num_req < min_p:
            return None
    if max_p is not None:
        if max_p < num_req:
            return None
        if max_p < len(entries):
            entries = [e for e in entries if e[1]]  # only the required ones (subset)
    return entries


def _map_regex(
    c, s: dict, refs, addl: Any, patterns: dict, min_p: int, max_p: int | None
) -> str | None:
    ws = c.ws
    key = R.STRING
    if "propertyNames" in s:
        key = c.value({"allOf": [{"type": "string"}, s["propertyNames"]]}, refs)
        if key is None:
            return f"\\{{{ws}\\}}" if min_p == 0 else None
    if patterns:
        # Only keys spelled by some pattern: such a key must satisfy every pattern it matches,
        # so its value satisfies all pattern schemas at once (a subset; undeclared keys that
        # match no pattern are never written, whatever additionalProperties says).
        if "propertyNames" in s:
            raise GrammarError("patternProperties together with propertyNames cannot be enforced")
        value = c.value({"allOf": list(patterns.values())}, refs)
        keys = [c.value({"type": "string", "pattern": pat}, refs) for pat in patterns]
        key = alt([k for k in keys if k is not None])
    else:
        value = c.value(addl, refs)
    if min_p > 1:
        raise GrammarError(
            "minProperties > 1 on an object without declared properties cannot be enforced "
            "(duplicate generated keys would count once)"
        )
    if value is None or key is None or max_p == 0:
        return f"\\{{{ws}\\}}" if min_p == 0 else None
    entry = f"{key}{ws}:{ws}{value}"
    more = "*" if max_p is None else f"{{0,{max_p - 1}}}"
    body = f"{entry}(?:{ws},{ws}{entry}){more}"
    return f"\\{{{ws}{body if min_p else f'(?:{body})?'}{ws}\\}}"


def array_regex(c, s: dict, refs: tuple[str, ...]) -> str | None:
    ws = c.ws
    lo, hi = s.get("minItems", 0), s.get("maxItems")
    for key, v in (("minItems", lo), ("maxItems", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise GrammarError(f"{key} must be a non-negative integer, got {v!r}")
    if s.get("uniqueItems") is True and (hi is None or hi > 1):
        raise GrammarError(
            "uniqueItems cannot be enforced by a regex grammar (set maxItems <= 1 or drop it)"
        )
    prefix = s.get("prefixItems") or []
    items = s.get("items", True)
    prefix_rx = [c.value(p, refs) for p in prefix]
    rest_rx = None if items is False else c.value(items, refs)
    sep = f"{ws},{ws}"

    def tail(i: int) -> str | None:
        """Elements from position i on, i elements already written; None = cannot reach minItems."""
        if hi is not None and i >= hi:
            return ""
        lead = "" if i == 0 else sep
        if i < len(prefix_rx):
            rest = tail(i + 1)
            if prefix_rx[i] is None or rest is None:
                return "" if i >= lo else None
            elem = lead + prefix_rx[i] + rest
            return f"(?:{elem})?" if i >= lo else elem
        if rest_rx is None:
            return "" if i >= lo else None
        need, cap = max(lo - i, 0), (None if hi is None else hi - i)
        if i == 0:
            more = f"(?:{sep}{rest_rx}){{{max(need - 1, 0)},{'' if cap is None else cap - 1}}}"
            return f"{rest_rx}{more}" if need else f"(?:{rest_rx}{more})?"
        return f"(?:{sep}{rest_rx}){{{need},{'' if cap is None else cap}}}"

    if hi is not None and hi < lo:
        return None
    body = tail(0)
    return None if body is None else f"\\[{ws}{body}{ws}\\]"
