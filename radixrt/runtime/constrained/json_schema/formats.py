"""Formats outside JSON Schema's vocabulary are annotations: removed before llguidance sees a
schema.

JSON Schema defines a fixed set of `format` names; any other name (OpenAPI's "byte", "int32",
"password", tools' "color", "textarea", "mongoId"...) must be ignored by a validator, so the value
is any string. llguidance refuses the whole schema at an unknown name ("Unknown format: byte"),
which sent schemas such as the MCP spec's to the slow outlines fallback or refused them. Standard
names llguidance does not implement (uri-template, regex, json-pointer...) stay: dropping those
would admit strings a format-asserting validator rejects, so llguidance keeps refusing them.

Only schema positions are walked (a `const`, `enum` or `default` value holding a "format" key is
data).
"""

from __future__ import annotations

from typing import Any

STANDARD_FORMATS = frozenset(
    {
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uuid",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)
SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
)  # name -> schema
SCHEMAS = (
    "items",
    "additionalItems",
    "contains",
    "not",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "if",
    "then",
    "else",
)  # a schema (items: or a list)
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def without_nonstandard_formats(schema: Any) -> Any:
    """A copy of `schema` without `format` keywords whose value JSON Schema does not define."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(schema.get("format"), str) and schema["format"] not in STANDARD_FORMATS:
        del out["format"]
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: without_nonstandard_formats(sub) for name, sub in schema[key].items()}
    for key in SCHEMAS + SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [without_nonstandard_formats(sub) for sub in schema[key]]
        elif key in schema:
            out[key] = without_nonstandard_formats(schema[key])
    deps = schema.get("dependencies")
    if isinstance(deps, dict):  # draft 7: a name -> a list of names (kept) or a schema
        out["dependencies"] = {name: without_nonstandard_formats(sub) for name, sub in deps.items()}
    return out
