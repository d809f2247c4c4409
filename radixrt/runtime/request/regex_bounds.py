"""What a regex constraint costs, read from its parse before any automaton is built (#41).

llguidance builds its automaton lazily, in the scheduler's step: the first mask of a regex costs
about 2 us per position of the regex with its counted repeats written out (`((a{99}){99}){99}`:
970,299 positions, ~2 s, during which no other request steps and /health waits), and outlines'
compile of such a regex is only stopped at the compile timeout. So a regex whose expansion is
larger than MAX_REGEX_EXPANSION is refused at the edge; the walk costs one pass over the parse.
"""

from __future__ import annotations

import functools
import re
from re import _constants as sre_constants  # Python's own reading of the pattern
from re import _parser as sre_parse

MAX_REGEX_EXPANSION = 100_000  # ~0.2 s for llguidance's first mask
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


@functools.lru_cache(maxsize=256)
def parse(regex: str) -> sre_parse.SubPattern:
    """Python's parse of a regex (~50 ms at 16k characters: done once per regex); re.error,
    RecursionError or OverflowError when Python cannot read it. Read it, never change it."""
    return sre_parse.parse(regex)


def _subpatterns(arg) -> list:
    """The subpatterns an item of a parse holds (a group's body, a branch's alternatives)."""
    if isinstance(arg, sre_parse.SubPattern):
        return [arg]
    out = []
    for item in arg if isinstance(arg, (tuple, list)) else ():
        if isinstance(item, sre_parse.SubPattern):
            out.append(item)
        elif isinstance(item, (tuple, list)):
            out += [x for x in item if isinstance(x, sre_parse.SubPattern)]
    return out


def expanded_size(parsed) -> int:
    """Positions of the pattern with each counted repeat written out (an unbounded one once past
    its minimum)."""
    size = 0
    for op, arg in parsed:
        if op in _REPEATS:
            low, high, body = arg
            copies = low + 1 if high == sre_constants.MAXREPEAT else high
            size += expanded_size(body) * max(1, copies)
        else:
            subs = _subpatterns(arg)
            size += sum(expanded_size(s) for s in subs) if subs else 1
    return size


def check_regex_expansion(regex: str, param: str = "regex", what: str = "regex") -> None:
    """ValueError naming the sampling parameter when the regex's expansion is too large (what: the
    regex's place in it, for a pattern inside a schema or a grammar). Syntax Python's parser refuses
    is left to the grammar backends (they accept some of it)."""
    try:
        size = expanded_size(parse(regex))
    except (re.error, RecursionError, OverflowError):
        return
    if size > MAX_REGEX_EXPANSION:
        raise ValueError(
            f"sampling parameter {param} is too large: its {what} with the counted repeats written "
            f"out has {size} positions, at most {MAX_REGEX_EXPANSION}"
        )
