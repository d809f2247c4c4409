"""Constraints and sampling parameters that cannot be met together, found at the edge (a 400 naming
both).

Every generated token is at least one byte of text (the constrained backends allow EOS only as the
end), and a character is at most 4 UTF-8 bytes, so a constraint whose longest match is L characters
cannot fill min_new_tokens > 4 L tokens (choices: their UTF-8 length): the request would reach a
point where the constraint allows only its end and min_new_tokens forbids it. Known here for a regex
(its parsed width) and for choices. What cannot be known before the step (a schema's
shape against the tokenizer) fails only that request there, with a clear reason (scheduler:
NoAllowedTokenError -> a 400 finish)."""

from __future__ import annotations

import functools
import re
from re import _parser as sre_parse

from radixrt.runtime.request.regex_bounds import parse


@functools.lru_cache(maxsize=256)
def longest_match_chars(regex: str) -> int | None:
    """The most characters a full match of regex can have; None when unbounded or unknown.

    Read from the parsed pattern's width, not from an automaton: an automaton can blow up
    (`[ab]*a[ab]{26}`, 2**27 states) and this runs at the edge, on the event loop (#41); the width
    costs one walk over the parse. Syntax Python's parser refuses (outlines and llguidance accept
    some of it) gives no verdict here."""
    try:
        longest = parse(regex).getwidth()[1]
    except (re.error, RecursionError, OverflowError):
        return None
    return None if longest >= sre_parse.MAXWIDTH else longest


def check_min_new_tokens(kind: str, spec, min_new_tokens: int) -> None:
    """ValueError naming both when the constraint cannot produce min_new_tokens tokens."""
    if min_new_tokens <= 0 or kind not in ("regex", "choices"):
        return
    if kind == "choices":
        most_bytes = max(len(c.encode()) for c in spec)
    else:
        chars = longest_match_chars(spec)
        most_bytes = None if chars is None else 4 * chars
    if most_bytes is not None and most_bytes < min_new_tokens:
        raise ValueError(
            f"sampling parameters {kind} and min_new_tokens cannot be met together: the {kind} "
            f"matches at most {most_bytes} bytes, fewer than min_new_tokens={min_new_tokens} "
            f"tokens (each token is at least one byte, "
            f"and the end may not come before the minimum)"
        )
