"""Regex building blocks for constrained decoding (Rust `regex` syntax, as outlines-core parses it).

Every regex here describes raw JSON *text* and is a subset of what the JSON-schema keyword
allows: a generated value may be narrower than the schema (no `\\u` escapes, no exponent in
bounded numbers, a 4-digit year in dates) but is never outside it. Digits are spelled
`[0-9]` because Rust's `\\d` is Unicode-aware.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal


class GrammarError(ValueError):
    """A regex / schema / choice list that cannot be compiled or enforced; the message names why."""


_META = set("\\.+*?()|[]{}^$#&-~")

# A JSON string body char: printable (no C0/C1 controls), or one of the short escapes.
# `\/` and `\uXXXX` are left out so each decoded char has exactly one spelling
# (needed to exclude declared keys) and lengths count one unit per char.
PLAIN_CHAR_CLASS = r'[^"\\\x00-\x1F\x7F-\x9F]'
STRING_CHAR = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\bfnrt])'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
BOOLEAN = r"(?:true|false)"
NULL = "null"
WHITESPACE = "[ ]?"  # bounded: at most one space between JSON tokens
MAX_FRACTION_DIGITS = 12  # fraction digits allowed in a bounded number (see number_range_regex)


def escape(text: str) -> str:
    """Regex matching `text` literally."""
    return "".join("\\" + c if c in _META else c for c in text)


def alt(parts: list[str]) -> str | None:
    """Alternation of regexes; None (the empty language) when there are none."""
    parts = list(dict.fromkeys(parts))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


# ---- integers ---------------------------------------------------------------------------


def _digits_fixed(lo: str, hi: str) -> str:
    """Regex for the same-length digit strings between lo and hi inclusive (lo <= hi)."""
    assert len(lo) == len(hi) and lo <= hi
    if not lo:
        return ""
    if lo == hi:
        return lo
    if set(lo) == {"0"} and set(hi) == {"9"}:
        return f"[0-9]{{{len(lo)}}}" if len(lo) > 1 else "[0-9]"
    if len(lo) == 1:
        return f"[{lo}-{hi}]"  # lo < hi here
    if lo[0] == hi[0]:
        return lo[0] + _digits_fixed(lo[1:], hi[1:])
    rest = len(lo) - 1
    parts = [lo[0] + _digits_fixed(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        a, b = int(lo[0]) + 1, int(hi[0]) - 1
        mid = f"[{a}-{b}]" if a < b else str(a)
        parts.append(mid + (f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]"))
    parts.append(hi[0] + _digits_fixed("0" * rest, hi[1:]))
    return alt(parts)


def _nonneg_range(lo: int, hi: int | None) -> str | None:
    """Canonical decimal spellings (no leading zeros) of the integers in [lo, hi]; hi None =
    unbounded."""
    assert lo >= 0
    if hi is not None and hi < lo:
        return None
    parts = []
    num_digits = len(str(lo))
    last = len(str(hi)) if hi is not None else num_digits
    for n in range(num_digits, last + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = 10**n - 1 if hi is None else min(hi, 10**n - 1)
        if a <= b:
            parts.append(_digits_fixed(str(a), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{num_digits},}}")
    return alt(parts)


def integer_range_regex(lo: int | None, hi: int | None) -> str | None:
    """JSON integers in [lo, hi] (either end may be None = unbounded); None if the range is
    empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # negatives: '-' then magnitudes in [max(1, -hi), -lo]
        mag = _nonneg_range(max(1, -hi) if hi is not None else 1, -lo if lo is not None else None)
        if mag is not None:
            parts.append("-" + mag)
    return alt([p for p in parts if p is not None])


# ---- bounded numbers --------------------------------------------------------------------
# A digit-string set is (empty_ok, regex of its non-empty members or None); a fraction F
# stands for the value 0.F, the empty string for "no fraction part" (value 0). Bounds are
# inclusive and already rounded inward to at most `budget` digits (see _float_bound).


def _cat(prefix: str, tail: tuple[bool, str | None]) -> str | None:
    empty_ok, rx = tail
    if rx is None:
        return prefix if empty_ok else None
    return f"{prefix}(?:{rx})?" if empty_ok else f"{prefix}(?:{rx})"


def _any_digits(budget: int) -> str:
    return f"[0-9]{{0,{budget}}}" if budget > 0 else ""


def _frac_ge(d: str, budget: int) -> tuple[bool, str | None]:
    d = d.rstrip("0")
    if not d:
        return True, (f"[0-9]{{1,{budget}}}" if budget > 0 else None)
    if budget <= 0:
        return False, None
    parts = [] if d[0] == "9" else [f"[{int(d[0]) + 1}-9]{_any_digits(budget - 1)}"]
    parts.append(_cat(d[0], _frac_ge(d[1:], budget - 1)))
    return False, alt([p for p in parts if p])


def _frac_le(d: str, budget: int) -> tuple[bool, str | None]:
    d = d.rstrip("0")
    if not d:
        return True, (f"0{{1,{budget}}}" if budget > 0 else None)
    if budget <= 0:
        return True, None
    parts = [] if d[0] == "0" else [f"[0-{int(d[0]) - 1}]{_any_digits(budget - 1)}"]
    parts.append(_cat(d[0], _frac_le(d[1:], budget - 1)))
    return True, alt([p for p in parts if p])


def _frac_between(lo: str, hi: str, budget: int) -> tuple[bool, str | None]:
    lo, hi = lo.rstrip("0"), hi.rstrip("0")
    if not lo:
        return _frac_le(hi, budget)
    if not hi or budget <= 0:  # lo > 0 = hi, or no digits left to exceed 0
        return False, None
    if lo[0] == hi[0]:
        return False, _cat(lo[0], _frac_between(lo[1:], hi[1:], budget - 1))
    parts = [_cat(lo[0], _frac_ge(lo[1:], budget - 1))]
    if int(hi[0]) - int(lo[0]) > 1:
        a, b = int(lo[0]) + 1, int(hi[0]) - 1
        parts.append((f"[{a}-{b}]" if a < b else str(a)) + _any_digits(budget - 1))
    parts.append(_cat(hi[0], _frac_le(hi[1:], budget - 1)))
    return False, alt([p for p in parts if p])


def _with_fraction(int_rx: str, frac: tuple[bool, str | None]) -> str | None:
    empty_ok, rx = frac
    if rx is None:
        return int_rx if empty_ok else None
    return f"{int_rx}(?:\\.{rx})?" if empty_ok else f"{int_rx}\\.{rx}"


def _split(x: Decimal) -> tuple[int, str]:
    int_part = int(x)  # x >= 0
    frac = format(x - int_part, "f")
    return int_part, frac.split(".")[1].rstrip("0") if "." in frac else ""


def _magnitude_range(lo: Decimal, hi: Decimal | None, k: int) -> str | None:
    """Unsigned decimals (no exponent, <= k fraction digits) with lo <= value <= hi (hi None =
    unbounded)."""
    lo_int, lo_frac = _split(lo)
    any_frac = (True, f"[0-9]{{1,{k}}}")
    if hi is None:
        return alt(
            [
                p
                for p in (
                    _with_fraction(str(lo_int), _frac_ge(lo_frac, k)),
                    _with_fraction(_nonneg_range(lo_int + 1, None), any_frac),
                )
                if p
            ]
        )
    if hi < lo:
        return None
    hi_int, hi_frac = _split(hi)
    if lo_int == hi_int:
        return _with_fraction(str(lo_int), _frac_between(lo_frac, hi_frac, k))
    parts = [_with_fraction(str(lo_int), _frac_ge(lo_frac, k))]
    middle = _nonneg_range(lo_int + 1, hi_int - 1)
    if middle is not None:
        parts.append(_with_fraction(middle, any_frac))
    parts.append(_with_fraction(str(hi_int), _frac_le(hi_frac, k)))
    return alt([p for p in parts if p])


def _float_bound(value: float, exclusive: bool, lower: bool, k: int) -> Decimal:
    """An inclusive decimal bound with <= k fraction digits that keeps float(x) on the right side.

    Float rounding is monotone, so a decimal x >= Decimal(repr(b)) parses to a float >= b. An
    exclusive bound becomes the inclusive neighbouring float; rounding the bound inward to k
    digits loses nothing because generated numbers have at most k fraction digits.
    """
    if exclusive:
        value = math.nextafter(value, math.inf if lower else -math.inf)
    q = Decimal(1).scaleb(-k)
    return Decimal(repr(float(value))).quantize(q, rounding=ROUND_CEILING if lower else ROUND_FLOOR)


def number_range_regex(
    lo: float | None, lo_excl: bool, hi: float | None, hi_excl: bool, k: int = MAX_FRACTION_DIGITS
) -> str | None:
    """JSON numbers in the given bounds, without exponent and with at most k fraction digits."""
    for v in (lo, hi):
        if v is not None and not math.isfinite(v):
            raise GrammarError(f"number bound {v!r} is not finite")
    dlo = _float_bound(lo, lo_excl, True, k) if lo is not None else None
    dhi = _float_bound(hi, hi_excl, False, k) if hi is not None else None
    if dlo is not None and dhi is not None and dlo > dhi:
        return None
    parts = []
    if dhi is None or dhi >= 0:  # non-negative values
        parts.append(
            _magnitude_range(max(dlo, Decimal(0)) if dlo is not None else Decimal(0), dhi, k)
        )
    if dlo is None or dlo < 0:  # negative values: magnitudes in [max(-hi, smallest), -lo], never -0
        smallest = Decimal(1).scaleb(-k)
        mag_lo = max(-dhi, smallest) if dhi is not None else smallest
        mag = _magnitude_range(mag_lo, -dlo if dlo is not None else None, k)
        if mag is not None:
            parts.append("-" + mag)
    return alt([p for p in parts if p])


# ---- string formats (regexes over the decoded text; none contains a char needing escape) ----

_YEAR = "[1-9][0-9]{3}"
_MONTH_DAY = (
    "(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    "|(?:0[13578]|1[02])-31)"
)
_LEAP_DAY = "(?:[1-9][0-9](?:0[48]|[2468][048]|[13579][26])|(?:[2468][048]|[13579][26])00)-02-29"
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = (
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?"
    "(?:Z|[+\\-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_LABEL = "[a-zA-Z0-9](?:[a-zA-Z0-9\\-]{0,61}[a-zA-Z0-9])?"
_HOST = f"{_LABEL}(?:\\.{_LABEL}){{0,2}}"
_PCHAR = "(?:[a-zA-Z0-9\\-._~!$&'()*+,;=:@]|%[0-9A-F]{2})"
_URI = (
    f"https?://{_HOST}(?::[1-9][0-9]{{0,3}})?(?:/{_PCHAR}*)*"
    f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9a-f]"

FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": (
        f"[a-zA-Z0-9_%+\\-]+(?:\\.[a-zA-Z0-9_%+\\-]+)*@{_LABEL}(?:\\.{_LABEL})*\\.[a-zA-Z]{{2,6}}"
    ),
    "hostname": _HOST,
    "ipv4": f"{_OCTET}(?:\\.{_OCTET}){{3}}",
    "ipv6": f"(?:{_HEX}{{1,4}}:){{7}}{_HEX}{{1,4}}",
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "uri": _URI,
    "uri-reference": f"(?:{_URI}|(?:/{_PCHAR}+)+)",
    "iri": _URI,
    "iri-reference": f"(?:{_URI}|(?:/{_PCHAR}+)+)",
    "json-pointer": "(?:/(?:[a-zA-Z0-9_\\-.]|~[01])*)*",
    "duration": "P(?:[1-9][0-9]{0,3}[YMWD]|T[1-9][0-9]{0,3}[HMS])",
}
# Formats of the JSON-schema vocabulary that are validated but that we cannot generate: rejected.
# Any other (non-standard) format name is an annotation that validators ignore, and so do we.
UNSUPPORTED_FORMATS = {
    "idn-email",
    "idn-hostname",
    "uri-template",
    "relative-json-pointer",
    "regex",
}
