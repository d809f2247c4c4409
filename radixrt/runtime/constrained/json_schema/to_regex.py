"""JSON schema -> regex, enforcing what outlines-core's own converter ignores.

outlines-core 0.2.14 silently drops minimum/maximum, exclusive bounds, allOf, uniqueItems and
patternProperties, and fails on subschemas without `type`. This converter normalises first
($ref/$defs, allOf merging, type inference; normalize.py) and then either enforces a
keyword exactly, generates a subset of what it allows, or raises GrammarError naming it.
It never claims success for output the schema would reject. Subsets it chooses:
- objects list declared properties in declaration order and no undeclared keys (an object
  without `properties` gets generic keys, as a map);
- no unbounded whitespace: at most one space between tokens;
- strings without \\u escapes; bounded numbers without exponent and <= 12 fraction digits;
- recursive $refs are expanded max_recursion_depth times, then only optional parts are cut;
- untyped values (`{}`) are generic JSON nested at most `generic_depth` levels.
Rejected: not (beyond types), if/then/else, contains, uniqueItems, dependentSchemas,
multipleOf that is not enumerable, min/maxProperties it cannot count, overlapping oneOf
branches, formats we cannot generate (see grammar_regex.FORMATS), pattern with lookaround."""

from __future__ import annotations

import json
import math
from typing import Any

from radixrt.runtime.constrained import regex_builder as R
from radixrt.runtime.constrained.json_schema.normalize import (
    ANNOTATIONS,
    MAX_BRANCHES,
    TYPES,
    Resolver,
    literal_type,
    make_literal_checker,
    normalize,
    schema_types,
)
from radixrt.runtime.constrained.json_schema.objects import array_regex, object_regex
from radixrt.runtime.constrained.json_schema.oneof import check_one_of
from radixrt.runtime.constrained.pattern import pattern_to_regex
from radixrt.runtime.constrained.regex_builder import GrammarError, alt, escape

_REJECTED = {
    "if": "if/then/else",
    "then": "if/then/else",
    "else": "if/then/else",
    "contains": "contains",
    "minContains": "contains",
    "maxContains": "contains",
    "dependentSchemas": "dependentSchemas",
    "unevaluatedProperties": "unevaluatedProperties",
    "unevaluatedItems": "unevaluatedItems",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
}
MAX_ENUM_MULTIPLES = 256
MAX_REGEX_CHARS = 500_000


class SchemaCompiler:
    def __init__(
        self,
        root: Any,
        whitespace: str = R.WHITESPACE,
        max_recursion_depth: int = 3,
        generic_depth: int = 1,
    ):
        self.root = root
        self.ws = whitespace
        self.resolver = Resolver(root)
        self.max_depth = max_recursion_depth
        self.generic_depth = generic_depth
        self._check = None
        self._generic: dict[int, str] = {}
        self._memo: dict[tuple, tuple[Any, str | None]] = {}

    def regex(self) -> str:
        rx = self.value(self.root, ())
        if rx is None:
            raise GrammarError(
                "the schema admits no value (contradictory, or recursive without a base case)"
            )
        return rx

    # -- helpers shared with grammar_schema_objects ------------------------------------------------
    def check_literal(self, value: Any, schema: Any) -> bool:
        if self._check is None:
            self._check = make_literal_checker(self.root) or False
        if self._check is False:
            raise GrammarError("checking literal values needs the `jsonschema` package")
        return self._check(value, schema)

    def generic(self, depth: int) -> str:
        """Any JSON value nested at most `depth` levels (objects/arrays), bounded whitespace."""
        if depth not in self._generic:
            prim = alt([R.STRING, R.NUMBER, R.BOOLEAN, R.NULL])
            if depth <= 0:
                self._generic[depth] = prim
            else:
                inner, ws = self.generic(depth - 1), self.ws
                arr = f"\\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\\]"
                obj = (
                    f"\\{{{ws}(?:{R.STRING}{ws}:{ws}{inner}"
                    f"(?:{ws},{ws}{R.STRING}{ws}:{ws}{inner})*)?{ws}\\}}"
                )
                self._generic[depth] = alt([prim, arr, obj])
        return self._generic[depth]

    def normalized(self, schema: Any, refs: tuple[str, ...]) -> dict | bool:
        return normalize(schema, self.resolver, refs, self.max_depth)[0]

    # -- dispatch --------------------------------------------------------------------------------
    def value(self, schema: Any, refs: tuple[str, ...]) -> str | None:
        """Regex for `schema` (None: it admits no value we can generate)."""
        key = (id(schema), refs)
        hit = self._memo.get(key)
        if hit is None:
            rx = self._value(schema, refs)
            if rx is not None and len(rx) > MAX_REGEX_CHARS:
                raise GrammarError(
                    f"the schema expands to a regex of more than {MAX_REGEX_CHARS} chars "
                    "(deep recursion or very large alternatives)"
                )
            hit = self._memo[key] = (schema, rx)  # holding `schema` keeps its id from being reused
        return hit[1]

    def _value(self, schema: Any, refs: tuple[str, ...]) -> str | None:
        s, refs = normalize(schema, self.resolver, refs, self.max_depth)
        if s is False:
            return None
        for key in s:
            if key in _REJECTED and not (key == "unevaluatedProperties" and s[key] is True):
                raise GrammarError(
                    f"keyword {_REJECTED[key]!r} is not supported in constrained decoding"
                )
        for comb in ("anyOf", "oneOf"):
            if comb in s:
                return self._combinator(comb, s, refs)
        if "enum" in s:
            return self._enum(s)
        types = schema_types(s)
        if types is None:
            return self.generic(self.generic_depth)
        if "number" in types:
            types.discard("integer")  # integers are numbers; the number regex covers them
        parts = []
        for t in TYPES:
            if t in types:
                rx = self._typed(t, s, refs)
                if rx is not None:
                    parts.append(rx)
        return alt(parts)

    def _typed(self, t: str, s: dict, refs: tuple[str, ...]) -> str | None:
        if t == "null":
            return R.NULL
        if t == "boolean":
            return R.BOOLEAN
        if t in ("integer", "number"):
            return self._number(s, integer=(t == "integer"))
        if t == "string":
            return self._string(s)
        if t == "array":
            return array_regex(self, s, refs)
        return object_regex(self, s, refs)

    def _combinator(self, comb: str, s: dict, refs: tuple[str, ...]) -> str | None:
        siblings = {k: v for k, v in s.items() if k not in (comb, *ANNOTATIONS)}
        branches = [{"allOf": [siblings, b]} if siblings else b for b in s[comb]]
        if len(branches) > MAX_BRANCHES:
            raise GrammarError(f"{comb} with more than {MAX_BRANCHES} branches")
        if comb == "oneOf" and len(branches) > 1:
            overlap = check_one_of(self, branches, refs)
            if overlap is not None:
                raise GrammarError(
                    f"oneOf branches {overlap[0]} and {overlap[1]} may both match one value, "
                    "so 'exactly one' cannot be enforced"
                )
        return alt([rx for rx in (self.value(b, refs) for b in branches) if rx is not None])

    def _enum(self, s: dict) -> str | None:
        rest = {k: v for k, v in s.items() if k != "enum" and k not in ANNOTATIONS}
        values = s["enum"]
        if not isinstance(values, list):
            raise GrammarError("enum must be a list")
        if rest and set(rest) - {"type"}:
            values = [v for v in values if self.check_literal(v, rest)]
        elif "type" in rest:
            types = set(rest["type"] if isinstance(rest["type"], list) else [rest["type"]])
            if "number" in types:
                types.add("integer")
            values = [
                v
                for v in values
                if literal_type(v) in types or (literal_type(v) == "integer" and "number" in types)
            ]
        return alt(
            [escape(json.dumps(v, ensure_ascii=False, separators=(",", ":"))) for v in values]
        )

    def _number(self, s: dict, integer: bool) -> str | None:
        bounds = {}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if key in s:
                v = s[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise GrammarError(f"{key} must be a finite number, got {v!r}")
                bounds[key] = v
        lo_i, lo_x, hi_i, hi_x = (
            bounds.get(k) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
        )
        mult = bounds.get("multipleOf")
        if mult is not None and mult <= 0:
            raise GrammarError("multipleOf must be > 0")
        if mult is not None and float(mult).is_integer():
            integer, mult = True, int(mult)
            if mult == 1:
                mult = None
        if integer:
            lows = ([math.ceil(lo_i)] if lo_i is not None else []) + (
                [math.floor(lo_x) + 1] if lo_x is not None else []
            )
            highs = ([math.floor(hi_i)] if hi_i is not None else []) + (
                [math.ceil(hi_x) - 1] if hi_x is not None else []
            )
            lo, hi = max(lows, default=None), min(highs, default=None)
            if mult is None:
                return R.integer_range_regex(lo, hi)
            if lo is None or hi is None or (hi - lo) // mult > MAX_ENUM_MULTIPLES:
                raise GrammarError(
                    f"multipleOf {mult} is only supported on a range of at most "
                    f"{MAX_ENUM_MULTIPLES} multiples (set minimum and maximum)"
                )
            first = -(-lo // mult) * mult
            return alt([str(v) for v in range(first, hi + 1, mult)])
        if mult is not None:
            raise GrammarError(
                f"multipleOf {mult} on numbers cannot be enforced (only integer multiples)"
            )
        if not bounds:
            return R.NUMBER
        lo, lo_excl = _tighter(lo_i, lo_x, lower=True)
        hi, hi_excl = _tighter(hi_i, hi_x, lower=False)
        return R.number_range_regex(lo, lo_excl, hi, hi_excl)

    def _string(self, s: dict) -> str | None:
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        for key, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} must be a non-negative integer, got {v!r}")
        if hi is not None and hi < lo:
            return None
        fmt = s.get("format")
        if isinstance(fmt, str) and fmt in R.UNSUPPORTED_FORMATS:
            raise GrammarError(f"string format {fmt!r} is not supported")
        body = width = None
        if isinstance(fmt, str) and fmt in R.FORMATS:
            body = R.FORMATS[fmt]
            width = _width(body)
        if "pattern" in s:
            if body is not None:
                raise GrammarError(f"pattern together with format {fmt!r} cannot be enforced")
            body, w_lo, w_hi = pattern_to_regex(s["pattern"])
            width = (w_lo, w_hi)
        if body is None:
            return f'"{R.STRING_CHAR}{{{lo},{"" if hi is None else hi}}}"'
        if width[0] < lo or (hi is not None and (width[1] is None or width[1] > hi)):
            raise GrammarError(
                "minLength/maxLength together with pattern or format cannot be enforced"
            )
        return f'"{body}"'


def _tighter(incl, excl, lower: bool) -> tuple[float | None, bool]:
    """The binding bound of minimum/exclusiveMinimum (or of the maxima): (value, exclusive)."""
    if excl is None:
        return incl, False
    if incl is None or (excl >= incl if lower else excl <= incl):
        return excl, True
    return incl, False


def _width(body: str) -> tuple[int, int | None]:
    import re._parser as sre_parse

    lo, hi = sre_parse.parse(body).getwidth()
    return lo, (None if hi >= 1 << 31 else hi)


def schema_to_regex(
    schema: Any, whitespace: str = R.WHITESPACE, max_recursion_depth: int = 3
) -> str:
    """Regex of the JSON texts we will generate for `schema` (a dict, a bool or a JSON string)."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(
            f"json_schema must be a JSON object or boolean, got {type(schema).__name__}"
        )
    try:
        return SchemaCompiler(schema, whitespace, max_recursion_depth).regex()
    except RecursionError:
        raise GrammarError("json_schema is nested too deeply") from None
    except (
        TypeError,
        AttributeError,
        KeyError,
    ) as e:  # malformed keyword values, e.g. properties: []
        raise GrammarError(f"malformed json_schema: {type(e).__name__}: {e}") from None


def json_object_regex(depth: int = 3, whitespace: str = R.WHITESPACE) -> str:
    """Any JSON object (response_format json_object), nested at most `depth` levels."""
    return SchemaCompiler({"type": "object"}, whitespace, generic_depth=depth - 1).regex()


def choices_regex(choices: list[str]) -> str:
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("choices must be a non-empty list of strings")
    return alt([escape(c) for c in choices])
