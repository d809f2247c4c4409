"""xgrammar grammars: a constraint's key -> an xgrammar Grammar (grammar_for), and the compile
worker that turns one into a CompiledGrammar in a process of its own
(`python -m radixrt.runtime.constrained.xgrammar_compile`, started by compile_pool.py exactly as
outlines' compile_worker is).

Why a process: xgrammar's compiler is C++ and cannot be interrupted; in a thread a runaway compile
would hold a core until it ended. Here it is killed at grammar_compile_timeout (the pool's
deadline), niced, under an address-space limit. The result crosses back as xgrammar's own
serialized JSON (CompiledGrammar.serialize_json, the token-mask caches included, so the scheduler's
first masks cost no more than later ones). Setup frame: (TokenizerInfo JSON | None, memory_bytes,
strict, threads); None: the edge's workers, which only check that a constraint converts ("check"
jobs).

Spec -> grammar: regex, choices, tool_call_grammar -> xgrammar's regex grammar of spec_regex (the
same regex outlines and llguidance get); json_schema -> xgrammar's JSON-schema grammar with strict
mode = --json-schema-strict (declared keys only where the schema is silent) and the whitespace the
other backends use ("[ ]?" between tokens: xgrammar's one-character whitespace rules narrowed to a
space); json_object -> any object, up to JSON_OBJECT_MAX_WS whitespace characters per gap; ebnf ->
GBNF (`root ::= ...`, xgrammar's EBNF, as SGLang passes it).

Soundness: xgrammar ignores some JSON-schema keywords (`not`, `uniqueItems`, `if`, keywords beside a
`$ref`...) and enforces a wider language without saying so, or says so only in a log line. Such a
schema is refused here with the keyword named (unenforced()), and a warning xgrammar prints while
converting (oneOf it cannot prove disjoint, multipleOf on numbers, allOf of several schemas,
minLength beside a pattern) is turned into the refusal's reason, so an accepted schema's output is
valid JSON Schema output (benchmarks/bench_grammar.py checks this on JSONSchemaBench).
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
from typing import Any, BinaryIO

from radixrt.runtime.constrained.compile_worker import (
    as_key,
    die_with_parent,
    read_frame,
    result_pipe,
    write_result,
)
from radixrt.runtime.constrained.json_schema.formats import without_nonstandard_formats
from radixrt.runtime.constrained.json_schema.strict import LIST_KEYS, MAP_KEYS, SCHEMA_KEYS
from radixrt.runtime.constrained.regex_builder import FORMATS, UNSUPPORTED_FORMATS, GrammarError
from radixrt.runtime.constrained.spec import spec_regex

JSON_OBJECT_MAX_WS = 40
WORKER_NICENESS = 10
# xgrammar's one-character whitespace rule (any_whitespace, max_whitespace_cnt=1), as it prints it
_WS_RULE = re.compile(r'^(\S+) ::= \(""\s*\|\s*\(\[ \\n\\r\\t\]\)\)$', re.M)
# a quoted literal or a character class, in printed EBNF (escapes inside both)
_LITERAL_OR_CLASS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
_CONTROLS = "\\0-\\x1f"
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")  # "[12:00:00] /project/cpp/x.cc:42: "
# keywords xgrammar (0.2.x) does not enforce at all
IGNORED = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
)
# xgrammar reads the first of these a schema object has and no other assertion beside it
EXCLUSIVE = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
# JSON Schema's assertions and applicators (any other key is an annotation or unknown: no effect)
ASSERTIONS = frozenset(
    "type properties required additionalProperties patternProperties propertyNames minProperties "
    "maxProperties items prefixItems additionalItems minItems maxItems uniqueItems contains "
    "unevaluatedProperties unevaluatedItems minLength maxLength pattern format minimum maximum "
    "exclusiveMinimum exclusiveMaximum multipleOf $ref const enum anyOf oneOf allOf".split()
)
_JSON_TYPES = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}


def clean(error: Exception) -> str:
    """xgrammar's message without its log prefix, on one bounded line."""
    text = " ".join(_LOG_PREFIX.sub("", str(error)).split())
    return text if len(text) <= 300 else text[:150] + " ... " + text[-150:]


def _of_type(value: Any, types: Any) -> bool:
    types = types if isinstance(types, list) else [types]
    for t in types:
        if t in ("number", "integer"):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if t == "number" or float(value).is_integer():
                    return True
        elif t in _JSON_TYPES and isinstance(value, _JSON_TYPES[t]):
            return True
    return False


def _subschemas(s: dict) -> list[tuple[str, Any]]:
    """(path step, subschema) of every schema position directly under `s`."""
    out = []
    for key in MAP_KEYS:
        if isinstance(s.get(key), dict):
            out += [(f"{key}/{name}", sub) for name, sub in s[key].items()]
    for key in SCHEMA_KEYS + LIST_KEYS + ("allOf",):
        subs = s.get(key)
        if isinstance(subs, list):
            out += [(f"{key}/{i}", sub) for i, sub in enumerate(subs)]
        elif key in s:
            out.append((key, subs))
    return out


def precise_formats(s: Any) -> Any:
    """A copy of `s` whose string formats are our own patterns (regex_builder.FORMATS: subsets of
    each format, exact for dates, where xgrammar's own date takes 2023-02-31); GrammarError for a
    standard format neither enforces, or a format beside a pattern (xgrammar keeps one of them)."""
    if not isinstance(s, dict):
        return s
    out = dict(s)
    fmt = s.get("format")
    if isinstance(fmt, str) and (fmt in FORMATS or fmt in UNSUPPORTED_FORMATS):
        if fmt in UNSUPPORTED_FORMATS:
            raise GrammarError(f"json_schema: string format {fmt!r} is not supported")
        if "pattern" in s:
            raise GrammarError("json_schema: xgrammar enforces 'format' or 'pattern', not both")
        del out["format"]
        out["pattern"] = f"^{FORMATS[fmt]}$"
    for key in MAP_KEYS:
        if isinstance(s.get(key), dict):
            out[key] = {name: precise_formats(sub) for name, sub in s[key].items()}
    for key in SCHEMA_KEYS + LIST_KEYS + ("allOf",):
        if isinstance(s.get(key), list):
            out[key] = [precise_formats(sub) for sub in s[key]]
        elif key in s:
            out[key] = precise_formats(s[key])
    return out


def unenforced(s: Any, where: str = "#") -> str | None:
    """Why xgrammar would enforce a wider language than `s` (a keyword it ignores, or assertions
    beside one it reads alone), or None."""
    if not isinstance(s, dict):
        return None
    for k in IGNORED:
        if k in s:
            return f"{where}: xgrammar does not enforce {k!r}"
    if s.get("uniqueItems") is True:
        return f"{where}: xgrammar does not enforce 'uniqueItems'"
    first = next((k for k in EXCLUSIVE if k in s), None)
    if first is not None:
        beside = sorted(k for k in s if k != first and k in ASSERTIONS)
        if first in ("const", "enum") and beside == ["type"]:
            values = [s["const"]] if first == "const" else s["enum"]
            beside = [] if all(_of_type(v, s["type"]) for v in values or []) else beside
        if beside:
            return f"{where}: xgrammar reads {first!r} alone and would ignore {beside}"
    props, patterns = s.get("properties"), s.get("patternProperties")
    if isinstance(props, dict) and isinstance(patterns, dict):
        for pattern in patterns:
            try:
                both = [name for name in props if re.search(pattern, name)]
            except (re.error, TypeError):
                both = ["?"]
            if both:  # JSON Schema checks such a key against both; xgrammar against properties
                return f"{where}: xgrammar ignores patternProperties for a declared key {both[0]!r}"
    for step, sub in _subschemas(s):
        why = unenforced(sub, f"{where}/{step}")
        if why:
            return why
    return None


class _Warnings:
    """xgrammar's C++ warnings (printed on fd 2) while converting, read back as text. Only in a
    process of our own (the worker, a benchmark child): it swaps the process's stderr."""

    def __enter__(self) -> "_Warnings":
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.lines = [
            _LOG_PREFIX.sub("", line).removeprefix("Warning: ")
            for line in self._file.read().decode("utf-8", "replace").splitlines()
            if "Warning" in line
        ]
        self._file.close()


def _schema_grammar(spec: str, strict: bool, capture: bool) -> Any:
    import xgrammar as xgr

    schema = precise_formats(without_nonstandard_formats(json.loads(spec)))
    why = unenforced(schema)
    if why:
        raise GrammarError(f"json_schema {why}")
    if capture:
        with _Warnings() as warned:
            grammar = xgr.Grammar.from_json_schema(
                json.dumps(schema), any_whitespace=True, max_whitespace_cnt=1, strict_mode=strict
            )
        if warned.lines:
            raise GrammarError(f"json_schema: xgrammar does not enforce it: {warned.lines[0]}")
    else:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=True, max_whitespace_cnt=1, strict_mode=strict
        )
    # one space where the others allow "[ ]?" (newlines and tabs would make outputs incomparable)
    text = _WS_RULE.sub(r'\1 ::= ("" | ([ ]))', str(grammar))
    # xgrammar's length-bounded string characters, `[^"\\\r\n]`, admit raw control characters,
    # which JSON forbids anywhere: every negated class leaves them out
    return xgr.Grammar.from_ebnf(_LITERAL_OR_CLASS.sub(_without_controls, text))


def _without_controls(m: re.Match) -> str:
    token = m.group(0)
    if token.startswith("[^") and not token.startswith("[^" + _CONTROLS):
        return "[^" + _CONTROLS + token[2:]
    return token


def grammar_for(key: tuple, strict: bool = True, capture: bool = False) -> Any:
    """The xgrammar Grammar of a grammar key; GrammarError naming the problem. capture: turn
    xgrammar's conversion warnings into refusals (only in a process of our own: see _Warnings)."""
    import xgrammar as xgr

    kind, spec = key
    try:
        if kind == "json_schema":
            return _schema_grammar(spec, strict, capture)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema(
                '{"type": "object"}',
                any_whitespace=True,
                max_whitespace_cnt=JSON_OBJECT_MAX_WS,
                strict_mode=False,
            )
        if kind == "ebnf":
            return xgr.Grammar.from_ebnf(spec, root_rule_name="root")
        return xgr.Grammar.from_regex(spec_regex(key))  # regex, choices, tool_call_grammar
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's parse errors
        raise GrammarError(f"xgrammar cannot read the {kind}: {clean(e)}") from None


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    info_json, memory_bytes, strict, threads = read_frame(inp)
    die_with_parent()
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the server stops us
    # the start-up (torch, transformers, xgrammar: seconds of CPU) at the server's priority: niced,
    # on a busy machine it outlasted the pool's start-up grace, and the first job failed with it
    import xgrammar as xgr

    compiler = None
    if info_json is not None:
        info = xgr.TokenizerInfo.deserialize_json(info_json)
        # no cache here: the parent keeps compiled grammars (an LRU bounded in entries and bytes)
        compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    del info_json
    try:
        os.nice(WORKER_NICENESS)  # decoding comes first
    except OSError:
        pass
    if memory_bytes > 0:  # on top of what torch and xgrammar's imports already mapped
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes,) * 2)
    while True:
        try:
            job, key = read_frame(inp)
            key = as_key(key)
        except EOFError:
            return
        if job == "warm-up":
            write_result(out, "ok", None)
            continue
        try:
            grammar = grammar_for(key, strict, capture=True)
            if job == "check" or compiler is None:
                write_result(out, "ok", None)
                continue
            write_result(out, "ok", compiler.compile_grammar(grammar).serialize_json())
        except GrammarError as e:
            write_result(out, "err", str(e))
        except MemoryError:
            write_result(out, "err", f"the {key[0]} grammar needs more than the memory limit")
        except (RuntimeError, ValueError) as e:
            write_result(out, "err", f"xgrammar cannot compile the {key[0]}: {clean(e)}")


if __name__ == "__main__":
    serve(sys.stdin.buffer, result_pipe())
