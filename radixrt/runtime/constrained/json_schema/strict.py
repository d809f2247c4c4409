"""Declared keys only: the object language a generating model is held to, as xgrammar's strict mode
(SGLang's default) and our outlines path (objects.py) do.

JSON Schema lets an object carry any undeclared key unless `additionalProperties` says otherwise; a
small model given that freedom rambles (`"type":"object","properties":{...` pasted back from its
prompt until the budget runs out). For llguidance, which follows the standard,
`additionalProperties: false` is written into every object schema that declares `properties` and
says nothing about other keys. Not where it would change which values are valid beyond dropping
undeclared keys: a schema using allOf / if-then / dependentSchemas / unevaluatedProperties (which
combine an object's keys across subschemas), or declaring keys beside an anyOf / oneOf / $ref / not
on the same object, is left as it is.
"""

from __future__ import annotations

from typing import Any

MAP_KEYS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
)  # name -> schema
SCHEMA_KEYS = (
    "items",
    "additionalItems",
    "contains",
    "not",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
)  # a schema (or, for items, a list of schemas)
LIST_KEYS = ("anyOf", "oneOf", "prefixItems")  # lists of schemas
COMBINING = ("allOf", "if", "dependentSchemas", "dependencies", "unevaluatedProperties")
# applicators that, beside an object's own keywords, judge the same instance's keys
SIBLING_APPLICATORS = ("anyOf", "oneOf", "$ref", "not")
OBJECT_KEYWORDS = ("properties", "required", "patternProperties", "additionalProperties")


def declared_keys_only(schema: Any) -> Any:
    """A copy of `schema` whose objects admit only declared keys where it was silent (see above)."""
    if _uses(schema, COMBINING) or _mixes(schema):
        return schema
    return _strict(schema)


def _mixes(s: Any) -> bool:
    """Some subschema declares keys and also has an applicator beside them
    (`{"properties": .., "oneOf": ..}`, `{"$ref": .., "properties": ..}`): the keys of one instance
    are then declared in two places, and closing either would refuse the other's."""
    if isinstance(s, dict):
        if any(k in s for k in OBJECT_KEYWORDS) and any(k in s for k in SIBLING_APPLICATORS):
            return True
        return any(_mixes(v) for v in s.values())
    if isinstance(s, list):
        return any(_mixes(v) for v in s)
    return False


def _strict(s: Any) -> Any:
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for key in MAP_KEYS:
        if isinstance(s.get(key), dict):
            out[key] = {name: _strict(sub) for name, sub in s[key].items()}
    for key in SCHEMA_KEYS:
        if isinstance(s.get(key), list):
            out[key] = [_strict(sub) for sub in s[key]]
        elif key in s:
            out[key] = _strict(s[key])
    for key in LIST_KEYS:
        if isinstance(s.get(key), list):
            out[key] = [_strict(sub) for sub in s[key]]
    if (
        isinstance(s.get("properties"), dict)
        and "additionalProperties" not in s
        and "patternProperties" not in s
    ):
        out["additionalProperties"] = False
    return out


def _uses(s: Any, keys: tuple[str, ...]) -> bool:
    """Whether any subschema (found by walking every dict and list) has one of `keys` as a keyword.
    A property named like a keyword also counts: it only makes us leave the schema alone."""
    if isinstance(s, dict):
        return any(k in s for k in keys) or any(_uses(v, keys) for v in s.values())
    if isinstance(s, list):
        return any(_uses(v, keys) for v in s)
    return False
