"""JSON-schema normalisation before regex generation: resolve $ref, merge allOf, fold draft-4
forms and simple `not`, and answer "does this literal satisfy that schema".

normalize() returns a dict whose top level has no $ref / allOf / not (children are left as
they are and normalised when the compiler reaches them), or False for the empty language.
What a $ref names is found by refs.py's Resolver.
"""

from __future__ import annotations

import json
import re
from typing import Any

from radixrt.runtime.constrained.json_schema.refs import Resolver
from radixrt.runtime.constrained.regex_builder import GrammarError

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "example",
    "$schema",
    "$id",
    "id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    "$anchor",
    "$defs",
    "definitions",
    "$vocabulary",
    "$dynamicAnchor",
}
_KIND_KEYWORDS = {
    "object": (
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependencies",
        "dependentSchemas",
    ),
    "array": (
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
    ),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
_MIN_KEYS = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"}
_MAX_KEYS = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"}
MAX_BRANCHES = 256


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def literal_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def schema_types(s: dict) -> set[str] | None:
    """Types a schema admits: explicit `type`, else inferred from its keywords; None = any."""
    t = s.get("type")
    if t is not None:
        types = set(t if isinstance(t, list) else [t])
        bad = types - set(TYPES)
        if bad:
            raise GrammarError(f"unknown type {sorted(bad)[0]!r}")
        return types
    inferred = {kind for kind, keys in _KIND_KEYWORDS.items() if any(k in s for k in keys)}
    return inferred or None


def _intersect_types(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None or b is None:
        return a if b is None else b
    out = a & b
    if ("integer" in a and "number" in b) or ("number" in a and "integer" in b):
        out.add("integer")
    return out


def _fold_forms(s: dict) -> dict:
    """Draft-4 boolean exclusives, tuple `items`, const -> enum. (OpenAPI's `nullable` is not JSON
    schema: validators ignore it, so null is not generated for it.)"""
    s = dict(s)
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(s.get(key), bool):
            if s.pop(key) and bound in s:
                s[key] = s.pop(bound)
    if isinstance(s.get("items"), list):
        s["prefixItems"] = s.pop("items")
        if "additionalItems" in s:
            s["items"] = s.pop("additionalItems")
    else:
        s.pop("additionalItems", None)  # without tuple items it has no effect
    if "const" in s:
        const = s.pop("const")
        s["enum"] = [v for v in s.get("enum", [const]) if canonical(v) == canonical(const)]
    if s.get("unevaluatedProperties") is False:
        s.pop("unevaluatedProperties")
        s.setdefault("additionalProperties", False)  # only declared properties are generated anyway
    return s


def _apply_not(s: dict) -> dict | bool:
    neg = s.pop("not")
    if neg is True or neg == {}:
        return False
    if isinstance(neg, dict) and set(neg) == {"type"}:
        removed = set(neg["type"] if isinstance(neg["type"], list) else [neg["type"]])
        types = schema_types(s) or set(TYPES)
        if "integer" in removed and "number" in types and "number" not in removed:
            raise GrammarError("'not' excluding integers from numbers cannot be enforced")
        if "number" in removed:
            removed.add("integer")
        s["type"] = [t for t in TYPES if t in types and t not in removed]
        return s if s["type"] else False
    raise GrammarError(f"keyword 'not' is only supported for types, got not={json.dumps(neg)[:80]}")


def merge(parts: list[dict]) -> dict | bool:
    """Intersection (allOf) of normalised schemas without combinators."""
    out: dict[str, Any] = {}
    types: set[str] | None = None
    for p in parts:
        types = _intersect_types(types, schema_types(p))
    for p in parts:
        for key, value in p.items():
            if key in ANNOTATIONS or key == "type":
                continue
            if key not in out:
                out[key] = value
            elif key in _MIN_KEYS:
                out[key] = max(out[key], value)
            elif key in _MAX_KEYS:
                out[key] = min(out[key], value)
            elif key == "required":
                out[key] = list(dict.fromkeys(out[key] + value))
            elif key == "enum":
                keep = {canonical(v) for v in value}
                out[key] = [v for v in out[key] if canonical(v) in keep]
            elif key == "not":  # not A and not B = not (A or B)
                out[key] = {"anyOf": [out[key], value]}
            elif key in ("items", "additionalProperties", "propertyNames", "contains"):
                out[key] = {"allOf": [out[key], value]}
            elif key in ("properties", "patternProperties"):
                merged = dict(out[key])
                for name, sub in value.items():
                    merged[name] = {"allOf": [merged[name], sub]} if name in merged else sub
                out[key] = merged
            elif canonical(out[key]) != canonical(value):
                raise GrammarError(
                    f"allOf combines different values of {key!r}, which cannot be enforced"
                )
    if "properties" in out:  # a key declared by one part must also satisfy the others' rules for it
        props = {}
        for name, sub in out["properties"].items():
            extra = [_extra_rule(p, name) for p in parts if name not in p.get("properties", {})]
            if any(e is False for e in extra):
                if name in out.get("required", []):
                    return False
                continue
            extra = [e for e in extra if e is not True and e != {}]
            props[name] = {"allOf": [sub] + extra} if extra else sub
        out["properties"] = props
    if types is not None:
        if not types:
            return False
        out["type"] = [t for t in TYPES if t in types]
    return out


def _extra_rule(part: dict, name: str) -> Any:
    """What `part` demands of a property it does not declare: its pattern schemas or
    additionalProperties."""
    matched = [
        sub for pat, sub in part.get("patternProperties", {}).items() if re.search(pat, name)
    ]
    if matched:
        return {"allOf": matched}
    return part.get("additionalProperties", True)


def normalize(
    schema: Any, resolver: Resolver, refs: tuple[str, ...], max_depth: int, defer_not: bool = False
) -> tuple[dict | bool, tuple[str, ...]]:
    """(normalised schema or False, the $ref chain including refs expanded here).

    `not` is kept when the schema is a finite literal set (enum/const): the compiler then keeps
    exactly the literals that fail the negated schema. Otherwise only type negations are
    enforced; allOf parts defer theirs until the parts are merged (a sibling may bring an enum).
    """
    if schema is True:
        return {}, refs
    if schema is False:
        return False, refs
    if not isinstance(schema, dict):
        raise GrammarError(
            f"a schema must be an object or a boolean, got {json.dumps(schema)[:80]}"
        )
    s = _fold_forms(schema)
    if "$ref" in s:
        ref = s.pop("$ref")
        if ref in refs and len(refs) - len(set(refs)) >= max_depth:
            return False, refs  # recursion cut: the consumer drops optional parts, or fails
        refs = refs + (ref,)
        target = resolver.resolve(ref)
        rest = {k: v for k, v in s.items() if k not in ANNOTATIONS}
        s = {"allOf": [target, rest]} if rest else {"allOf": [target]}
    if "allOf" in s:
        parts = []
        for sub in s.pop("allOf") + [s]:
            n, refs = normalize(sub, resolver, refs, max_depth, defer_not=True)
            if n is False:
                return False, refs
            parts.append(n)
        # distribute over the first combinator: A and (B or C) = (A and B) or (A and C)
        for i, p in enumerate(parts):
            for comb in ("anyOf", "oneOf"):
                if comb in p:
                    rest = [q for j, q in enumerate(parts) if j != i] + [
                        {k: v for k, v in p.items() if k != comb}
                    ]
                    if len(p[comb]) > MAX_BRANCHES:
                        raise GrammarError(f"{comb} with more than {MAX_BRANCHES} branches")
                    return {comb: [{"allOf": rest + [b]} for b in p[comb]]}, refs
        s = merge(parts)
        if s is False:
            return False, refs
    if "not" in s and not defer_not and "enum" not in s:
        s = _apply_not(s)
    return s, refs


def make_literal_checker(root: Any):
    """check(value, schema) -> bool using the jsonschema package (refs resolve against root)."""
    try:
        import jsonschema
    except ImportError:
        return None
    defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root, dict) and k in root}
    cls = jsonschema.validators.validator_for(
        root if isinstance(root, dict) else {}, default=jsonschema.Draft202012Validator
    )

    def check(value: Any, schema: Any) -> bool:
        wrapped = {"allOf": [schema], **defs} if isinstance(schema, (dict, bool)) else schema
        try:
            return cls(wrapped, format_checker=cls.FORMAT_CHECKER).is_valid(value)
        except Exception as e:  # unresolvable refs and the like: we cannot vouch for the value
            raise GrammarError(f"cannot check literal values against the schema: {e}") from None

    return check
