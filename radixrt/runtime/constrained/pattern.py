"""Translate a JSON-schema `pattern` (ECMA-262 regex on the decoded string) into a regex on the
JSON-encoded string body, and check user regexes before they reach the compiler.

The pattern is parsed with Python's own regex parser (close enough to ECMA for the syntax JSON
schemas use) and re-emitted in Rust syntax. A schema pattern is a *search*: unless anchored
with ^/$ it may match anywhere, so unanchored ends get any-string padding. Each decoded char
is emitted as its JSON spelling: `"` and `\\` become escapes, control chars their short escape,
and classes are intersected with printable chars (a subset, so the output stays valid).
Lookaround, backreferences, possessive/atomic groups and word boundaries cannot be expressed
in a DFA: GrammarError names them.
"""

from __future__ import annotations

import re
import re._constants as C
import re._parser as sre_parse
import warnings

from radixrt.runtime.constrained.regex_builder import (
    PLAIN_CHAR_CLASS,
    STRING_CHAR,
    GrammarError,
    alt,
    escape,
)

_SHORT_ESCAPES = {
    '"': '\\\\"',
    "\\": "\\\\\\\\",
    "\b": "\\\\b",
    "\f": "\\\\f",
    "\n": "\\\\n",
    "\r": "\\\\r",
    "\t": "\\\\t",
}
_NOT_PLAIN = '"\\\\\\x00-\\x1F\\x7F-\\x9F'  # body of the class of chars that are never emitted raw
_ECMA_SPACE = " \t\n\r\x0b\x0c\u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
)
_UNSUPPORTED = {
    C.ASSERT: "lookahead/lookbehind",
    C.ASSERT_NOT: "negative lookaround",
    C.GROUPREF: "backreference",
    C.GROUPREF_EXISTS: "conditional group",
    C.ATOMIC_GROUP: "atomic group",
    C.POSSESSIVE_REPEAT: "possessive quantifier",
}


def _parse(pattern: str, what: str) -> sre_parse.SubPattern:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        raise GrammarError(f"invalid {what} {pattern!r}: {e}") from None


def _check_flags(flags: int, what: str) -> None:
    if flags & ~(C.SRE_FLAG_UNICODE | C.SRE_FLAG_ASCII):
        raise GrammarError(f"{what}: inline flags other than unicode are not supported")


def _class_item_has(op, av, ch: str) -> bool:
    """Whether one item of a character class contains `ch` (ECMA meaning of the categories)."""
    o = ord(ch)
    if op is C.LITERAL:
        return av == o
    if op is C.RANGE:
        return av[0] <= o <= av[1]
    if op is C.CATEGORY:
        digit, word, space = (
            ch.isascii() and ch.isdigit(),
            ch.isascii() and (ch.isalnum() or ch == "_"),
            ch in _ECMA_SPACE,
        )
        return {
            C.CATEGORY_DIGIT: digit,
            C.CATEGORY_NOT_DIGIT: not digit,
            C.CATEGORY_WORD: word,
            C.CATEGORY_NOT_WORD: not word,
            C.CATEGORY_SPACE: space,
            C.CATEGORY_NOT_SPACE: not space,
        }[av]
    raise GrammarError(f"unsupported character class item {op}")


def _class_body(items: list, negated: bool) -> str:
    """Rust class body for the items: a subset of their ECMA meaning, or a superset when the
    class is negated (the complement of a superset is a subset)."""
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(escape(chr(av)))
        elif op is C.RANGE:
            out.append(f"{escape(chr(av[0]))}-{escape(chr(av[1]))}")
        elif op is C.CATEGORY:
            space = "\\s\\x{FEFF}" if negated else " "
            not_space = "[^ ]" if negated else "[^\\s\\x{FEFF}]"
            out.append(
                {
                    C.CATEGORY_DIGIT: "0-9",
                    C.CATEGORY_NOT_DIGIT: "[^0-9]",
                    C.CATEGORY_WORD: "A-Za-z0-9_",
                    C.CATEGORY_NOT_WORD: "[^A-Za-z0-9_]",
                    C.CATEGORY_SPACE: space,
                    C.CATEGORY_NOT_SPACE: not_space,
                }[av]
            )
        else:
            raise GrammarError(f"unsupported character class item {op}")
    return "".join(out)


def _char_set(items: list, negated: bool) -> str | None:
    """JSON spelling of any char of the class: raw printable chars plus escapes for specials."""
    body = _class_body(items, negated)
    raw = f"[[^{body}]&&[^{_NOT_PLAIN}]]" if negated else f"[[{body}]&&[^{_NOT_PLAIN}]]"
    if not body:
        raw = PLAIN_CHAR_CLASS if negated else ""
    specials = [
        esc
        for ch, esc in _SHORT_ESCAPES.items()
        if any(_class_item_has(op, av, ch) for op, av in items) != negated
    ]
    return alt(([raw] if raw else []) + specials)


def _char(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    if ord(ch) < 0x20:
        return f"\\\\u{ord(ch):04x}"
    return escape(ch)


class _Emitter:
    def __init__(self, pattern: str):
        self.pattern = pattern

    def fail(self, what: str) -> GrammarError:
        return GrammarError(
            f"pattern {self.pattern!r} uses {what}, which a regex-based grammar cannot enforce"
        )

    def seq(self, items: list, start: bool, end: bool) -> str:
        """Items of one sequence; `start`/`end`: nothing was consumed before / comes after it, so
        an anchor may stand there, and a missing anchor means any text may pad that side."""
        items = list(items)
        head = tail = ""
        if start:
            if (
                items
                and items[0][0] is C.AT
                and items[0][1] in (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
            ):
                items, start = items[1:], False  # anchored: nothing may precede
            elif not (items and items[0][0] in (C.BRANCH, C.SUBPATTERN)):
                head, start = STRING_CHAR + "*", False
        if end:
            if items and items[-1][0] is C.AT and items[-1][1] in (C.AT_END, C.AT_END_STRING):
                items, end = items[:-1], False
            elif not (items and items[-1][0] in (C.BRANCH, C.SUBPATTERN)):
                tail, end = STRING_CHAR + "*", False
        if not items:
            return STRING_CHAR + "*" if head or tail else ""
        body = [
            self.item(item, start and i == 0, end and i == len(items) - 1)
            for i, item in enumerate(items)
        ]
        return head + "".join(body) + tail

    def item(self, item, start: bool, end: bool) -> str:
        op, av = item
        if op in _UNSUPPORTED:
            raise self.fail(_UNSUPPORTED[op])
        if op is C.LITERAL:
            return _char(chr(av))
        if op is C.NOT_LITERAL:
            return _char_set([(C.LITERAL, av)], negated=True)
        if op is C.ANY:
            return PLAIN_CHAR_CLASS  # `.`: any char but newline; we emit printable ones
        if op is C.IN:
            negated = bool(av) and av[0][0] is C.NEGATE
            return _char_set(av[1:] if negated else av, negated) or "[^\\x00-\\x{10FFFF}]"
        if op is C.CATEGORY:
            return _char_set([(C.CATEGORY, av)], negated=False)
        if op is C.BRANCH:
            return alt([self.seq(branch, start, end) for branch in av[1]])
        if op is C.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            _check_flags(add_flags | del_flags, f"pattern {self.pattern!r}")
            return "(?:" + self.seq(sub, start, end) + ")"
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # laziness does not change the matched language
            lo, hi, sub = av
            inner = self.seq(sub, False, False)
            rep = f"{{{lo},}}" if hi >= C.MAXREPEAT else f"{{{lo},{hi}}}"
            return f"(?:{inner}){rep}"
        if op is C.AT:
            raise self.fail("an anchor or word boundary inside the pattern")
        raise self.fail(f"the construct {op}")


def pattern_to_regex(pattern: str) -> tuple[str, int, int | None]:
    """(regex over the JSON string body, min and max decoded length; max None = unbounded)."""
    parsed = _parse(pattern, "pattern")
    _check_flags(parsed.state.flags, f"pattern {pattern!r}")
    rx = _Emitter(pattern).seq(parsed.data, True, True)
    lo, hi = parsed.getwidth()
    if STRING_CHAR + "*" in rx:
        hi = C.MAXREPEAT
    return rx, lo, (None if hi >= C.MAXREPEAT else hi)


_RUST_ONLY = re.compile(r"\\[pP][{A-Za-z]|\\x\{|&&|--|~~|\[\[:|\(\?<[A-Za-z]")


def check_user_regex(regex: str) -> None:
    """Reject bad syntax and constructs a DFA cannot run. Python's parser judges the syntax
    unless the regex uses Rust-only forms (\\p{L}, \\x{..}, class set operations, (?<name>..)),
    which are left for the compiler."""
    try:
        with warnings.catch_warnings():  # "possible set intersection": Rust syntax, fine here
            warnings.simplefilter("ignore", FutureWarning)
            parsed = sre_parse.parse(regex)
    except (re.error, OverflowError, RecursionError) as e:
        if _RUST_ONLY.search(regex):
            return
        raise GrammarError(f"invalid regex {regex!r}: {e}") from None

    def walk(items) -> None:
        for op, av in items:
            if op in _UNSUPPORTED:
                raise GrammarError(
                    f"regex {regex!r} uses a {_UNSUPPORTED[op]}, which a DFA cannot run"
                )
            if op is C.AT and av in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
                raise GrammarError(f"regex {regex!r} uses a word boundary, which a DFA cannot run")
            for sub in av if isinstance(av, (list, tuple)) else ():
                if isinstance(sub, sre_parse.SubPattern):
                    walk(sub.data)
                elif (
                    isinstance(sub, list)
                    and sub
                    and all(isinstance(s, sre_parse.SubPattern) for s in sub)
                ):
                    for s in sub:
                        walk(s.data)

    walk(parsed.data)
