"""stop_regex (SGLang's sampling parameter): stop once the output text matches a regex.

SGLang runs `re.search` over the text's tail at every step. A backtracking search lets one request's
pattern ((a+)+b over a long run of a's) stall the scheduler for everyone, so here each pattern
becomes a character automaton (interegular, as the constrained decoders build theirs) and the text
is fed to it as it grows: the state is the set of automaton states of every match started at an
earlier character, so each new character costs one step over that set, whatever the pattern and
however long the output. Patterns use Python's syntax; what the automaton cannot express
(backreferences, lookarounds, anchors) and patterns that match the empty string (they would stop
every request at once) are refused by name at the edge.
"""

from __future__ import annotations

import functools
import re
from re import _constants as sre_constants  # Python's own reading of the pattern
from re import _parser as sre_parse

import interegular

MAX_STATES = 2048  # a pattern whose automaton is larger is refused (too costly to build and search)
MAX_MEMO = 4096  # cached (state set, symbol) transitions per pattern


# what an automaton over the text cannot mean as `re.search` does (interegular reads lookaheads as
# consuming)
_REFUSED = {
    sre_constants.ASSERT: "lookarounds",
    sre_constants.ASSERT_NOT: "lookarounds",
    sre_constants.AT: "anchors (^, $, \\b, \\A, \\Z)",
    sre_constants.GROUPREF: "backreferences",
    sre_constants.GROUPREF_EXISTS: "conditional groups",
}


def _refused_construct(parsed) -> str | None:
    for op, arg in parsed:
        if op in _REFUSED:
            return _REFUSED[op]
        for item in arg if isinstance(arg, (tuple, list)) else ():
            subs = (
                [item]
                if isinstance(item, sre_parse.SubPattern)
                else (
                    [x for x in item if isinstance(x, sre_parse.SubPattern)]
                    if isinstance(item, (tuple, list))
                    else []
                )
            )
            for sub in subs:
                found = _refused_construct(sub)
                if found:
                    return found
    return None


@functools.lru_cache(maxsize=256)
def _fsm(pattern: str) -> interegular.FSM:
    try:
        construct = _refused_construct(sre_parse.parse(pattern))
    except (re.error, RecursionError) as e:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not a valid regex: {e}"
        ) from None
    if construct:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not supported: it uses {construct}"
        )
    try:
        fsm = interegular.parse_pattern(pattern).to_fsm()
    except Exception as e:  # interegular's parse errors have several types
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not supported: {e or type(e).__name__}"
        ) from None
    if len(fsm.states) > MAX_STATES:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is too complex ({len(fsm.states)} states, "
            f"at most {MAX_STATES})"
        )
    if fsm.initial in fsm.finals:
        raise ValueError(f"sampling parameter stop_regex {pattern!r} matches the empty string")
    return fsm


def check_stop_regex(pattern: str) -> None:
    """Raise ValueError naming the pattern unless it can run."""
    _fsm(pattern)


class StopRegexSearch:
    """One pattern, searched incrementally over text fed in pieces."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.fsm = _fsm(pattern)
        self.live: frozenset[int] = frozenset()  # automaton states of the matches still open
        self.memo: dict[tuple[frozenset[int], int], frozenset[int]] = {}

    def feed(self, text: str) -> int | None:
        """Advance over text; the index just past the first character at which a match completes, or
        None."""
        fsm, finals, initial = self.fsm, self.fsm.finals, self.fsm.initial
        for i, ch in enumerate(text):
            symbol = fsm.alphabet[ch]
            key = (self.live, symbol)
            nxt = self.memo.get(key)
            if nxt is None:
                nxt = frozenset(
                    fsm.map[s][symbol]
                    for s in self.live | {initial}
                    if symbol in fsm.map.get(s, ())
                )
                if len(self.memo) < MAX_MEMO:
                    self.memo[key] = nxt
            self.live = nxt
            if nxt & finals:
                return i + 1
        return None
