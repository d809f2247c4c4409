"""stop_regex (SGLang's sampling parameter): stop once the output text matches a regex.

SGLang runs `re.search` over the text's tail at every step. A backtracking search lets one request's
pattern ((a+)+b over a long run of a's) stall the scheduler for everyone, so here each pattern
becomes a character automaton (interegular, as the constrained decoders build theirs) and the text
is fed to it as it grows: the state is the set of automaton states of every match started at an
earlier character, so each new character costs one step over that set, whatever the pattern and
however long the output. Patterns use Python's syntax; what the automaton cannot express
(backreferences, lookarounds, anchors) and patterns that match the empty string (they would stop
every request at once) are refused by name at the edge.

Building an automaton can blow up (`[ab]*a[ab]{26}` has 2**27 states), so the server's own
processes never build one for a pattern that was not built before within bounds:
`check_stop_regex` is cheap (the pattern's parse and its width: a shortest match of N characters
needs more than N states), and the edge builds every request's automata in a compile worker,
killed at a deadline (stop_regex_check.py); it accepts a request only when they were all built
within a CPU budget and MAX_STATES. The scheduler and the detokenizer process build the automaton
of an accepted pattern again (StopRegexSearch, below), so that rebuild costs at most about the
budget, once per pattern in each process.
"""

from __future__ import annotations

import functools
import re
import time
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


def check_stop_regex(pattern: str) -> None:
    """Raise ValueError naming the pattern when it can never run; cheap (no automaton is built)."""
    try:
        parsed = sre_parse.parse(pattern)
        construct = _refused_construct(parsed)
        shortest, longest = parsed.getwidth()
    except (re.error, RecursionError) as e:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not a valid regex: {e}"
        ) from None
    if construct:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not supported: it uses {construct}"
        )
    if shortest == 0:
        raise ValueError(f"sampling parameter stop_regex {pattern!r} matches the empty string")
    # the states along a shortest match are all distinct, and so are those along a longest one
    # when the language is finite: either length bounds the automaton from below
    if shortest >= MAX_STATES or MAX_STATES <= longest < sre_parse.MAXWIDTH:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is too complex (a match of "
            f"{shortest if shortest >= MAX_STATES else longest} characters needs more than "
            f"{MAX_STATES} automaton states)"
        )


def build_fsm(pattern: str) -> interegular.FSM:
    """The pattern's automaton, or ValueError naming the pattern. Unbounded: run it on a pattern
    the edge accepted, or in a compile worker."""
    check_stop_regex(pattern)
    try:
        fsm = interegular.parse_pattern(pattern).to_fsm()
    except MemoryError:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is too complex (its automaton does not "
            "fit in memory)"
        ) from None
    except Exception as e:  # interegular's parse errors have several types
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is not supported: {e or type(e).__name__}"
        ) from None
    if len(fsm.states) > MAX_STATES:
        raise ValueError(
            f"sampling parameter stop_regex {pattern!r} is too complex ({len(fsm.states)} states, "
            f"at most {MAX_STATES})"
        )
    if fsm.initial in fsm.finals:  # the width check above already says so; interegular agrees
        raise ValueError(f"sampling parameter stop_regex {pattern!r} matches the empty string")
    return fsm


_fsm = functools.lru_cache(maxsize=256)(build_fsm)


def build_seconds(patterns: tuple[str, ...]) -> list[float | str]:
    """For the compile worker: each pattern's build, in CPU seconds, or the refusal that ends the
    list. Built uncached, so a pattern seen before is timed as the scheduler would build it."""
    out: list[float | str] = []
    for pattern in patterns:
        started = time.process_time()
        try:
            build_fsm(pattern)
        except ValueError as e:
            return [*out, str(e)]
        out.append(time.process_time() - started)
    return out


class StopRegexSearch:
    """One pattern, searched incrementally over text fed in pieces."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        # built again in each process that searches (scheduler, detokenizer, Engine), not shipped:
        # bounded, as the edge accepts only patterns built within its budget (stop_regex_check.py)
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
