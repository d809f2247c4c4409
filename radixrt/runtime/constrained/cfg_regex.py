"""A context-free grammar's nesting-bounded regular part, as a regex: the DFA that budget-steers
`ebnf` requests.

Budget steering needs the fewest tokens from each state to the end of the grammar (budget.py), which
only a DFA gives; llguidance's Earley parser, which enforces the grammar, offers none. A grammar
nested at most a few levels deep is a regular language, a subset of the grammar's: outlines compiles
it in the background and it follows the request as a shadow (fallback.py), exactly as it does for
JSON schemas. While the output stays inside that subset (each rule nested in itself at most
MAX_NESTING times), near the end of the budget the pick is llguidance's mask AND the shadow's
steered tokens, so the output completes whenever a completion of the subset fits. Deeper output
drops the shadow.

The grammar (GBNF or Lark, as llguidance takes it) is converted to Lark by llguidance and read by
the `lark` package: its rules come out with `?` expanded into alternatives and `*` / `+` as
left-recursive helper rules (R: A | B | R A | R B), which are turned back into unbounded repetition
here. %ignore'd terminals may appear before, between and after any terminals, as in llguidance. A
grammar lark cannot read (llguidance's own extensions), a terminal outlines cannot compile, or a
regex past MAX_REGEX_CHARS (or MAX_EXPANSIONS) at every nesting bound leaves the request unsteered
(GrammarError here).
"""

from __future__ import annotations

import functools
from typing import Any

from radixrt.runtime.constrained.regex_builder import GrammarError

# times a rule may appear inside itself (the deepest that fits the limits below is used)
MAX_NESTING = 6
MAX_REGEX_CHARS = 60_000  # past this the DFA costs more to compile than steering is worth
# rule expansions tried per nesting bound (branches that come to nothing included)
MAX_EXPANSIONS = 20_000


def cfg_regex(spec: str) -> str:
    """The regex of `spec`'s nesting-bounded subset (the deepest bound that fits MAX_REGEX_CHARS);
    GrammarError when there is none. Cached per grammar: it runs on the scheduler's thread when a
    request's grammar arrives."""
    out = _cached(spec)
    if isinstance(out, GrammarError):
        # a new error each time: raising the cached one would chain every raise's traceback (the
        # scheduler's frames, and through them the engine and its model) onto the cache for good
        raise GrammarError(*out.args) from None
    return out


@functools.lru_cache(maxsize=256)
def _cached(spec: str) -> str | GrammarError:
    try:
        rules, terminals, ignore = _read(spec)
        for nesting in range(MAX_NESTING, 0, -1):
            builder = _Builder(rules, terminals, ignore, nesting)
            try:
                regex = builder.rule("start", ())
            except _TooLong:
                continue
            if regex is None:
                return GrammarError("the grammar has no derivation within the nesting bound")
            return f"{builder.sep}{regex}{builder.sep}"
        return GrammarError(
            f"the grammar's regular subset is longer than {MAX_REGEX_CHARS} characters"
        )
    except GrammarError as e:
        return e
    except Exception as e:  # noqa: BLE001
        # lark's and llguidance's many error types, a %declare'd terminal...
        return GrammarError(f"no regular subset for steering: {type(e).__name__}: {str(e)[:200]}")


def _read(spec: str) -> tuple[dict[str, list[list[Any]]], dict[str, str], list[str]]:
    try:
        import lark
        from llguidance.gbnf_to_lark import any_to_lark

        text = "\n".join(
            line
            for line in any_to_lark(spec).splitlines()
            if not line.lstrip().startswith("%llguidance")
        )
        parser = lark.Lark(text, start="start", keep_all_tokens=True)
    except Exception as e:  # noqa: BLE001
        # lark's and llguidance's many error types: no steering, nothing else
        raise GrammarError(
            f"no regular subset for steering: {type(e).__name__}: {str(e)[:200]}"
        ) from None
    rules: dict[str, list[list[Any]]] = {}
    for rule in parser.rules:
        rules.setdefault(rule.origin.name, []).append(list(rule.expansion))
    terminals = {t.name: t.pattern.to_regexp() for t in parser.terminals}
    return rules, terminals, [terminals[name] for name in parser.ignore_tokens if name in terminals]


class _TooLong(Exception):
    pass


class _Builder:
    def __init__(self, rules: dict, terminals: dict, ignore: list[str], nesting: int):
        self.rules, self.terminals, self.nesting = rules, terminals, nesting
        self.sep = "(?:" + "|".join(f"(?:{r})" for r in ignore) + ")*" if ignore else ""
        self.size = self.expansions = 0

    def rule(self, name: str, stack: tuple[str, ...]) -> str | None:
        """The regex of rule `name` inside the rules on `stack`; None where the nesting bound leaves
        nothing."""
        if stack.count(name) >= self.nesting:
            return None
        self.expansions += 1
        if self.expansions > MAX_EXPANSIONS:
            raise _TooLong
        stack += (name,)
        alternatives = self.rules[name]
        repeated = _repeated(name, alternatives)
        if repeated is not None:  # R: A | B | R A | R B  is  (A|B)+
            item = self.choice(repeated, stack)
            return None if item is None else self._count(f"{item}(?:{self.sep}{item})*")
        return self.choice(alternatives, stack)

    def choice(self, alternatives: list[list[Any]], stack: tuple[str, ...]) -> str | None:
        outs = [s for s in (self.sequence(alt, stack) for alt in alternatives) if s is not None]
        if not outs:
            return None
        return self._count("(?:" + "|".join(outs) + ")")

    def sequence(self, symbols: list[Any], stack: tuple[str, ...]) -> str | None:
        parts = []
        for sym in symbols:
            part = f"(?:{self.terminals[sym.name]})" if sym.is_term else self.rule(sym.name, stack)
            if part is None:
                return None
            parts.append(part)
        return self.sep.join(parts)

    def _count(self, regex: str) -> str:
        self.size += len(regex)
        if self.size > MAX_REGEX_CHARS * 4 or len(regex) > MAX_REGEX_CHARS:
            raise _TooLong
        return regex


def _repeated(name: str, alternatives: list[list[Any]]) -> list[list[Any]] | None:
    """The items of a left-recursive repetition rule `name: A | B | name A | name B` (lark's form of
    (A|B)+ and of the non-empty part of (A|B)*), or None for any other rule."""
    recursive = [
        alt[1:] for alt in alternatives if alt and not alt[0].is_term and alt[0].name == name
    ]
    base = [alt for alt in alternatives if not (alt and not alt[0].is_term and alt[0].name == name)]
    if not recursive or sorted(map(repr, recursive)) != sorted(map(repr, base)):
        return None
    return base
