"""Constraints and sampling parameters that cannot be met together, found at the edge (a 400 naming
both).

Every generated token is at least one byte of text (the constrained backends allow EOS only as the
end), and a character is at most 4 UTF-8 bytes, so a constraint whose longest match is L characters
cannot fill min_new_tokens > 4 L tokens (choices: their UTF-8 length): the request would reach a
point where the constraint allows only its end and min_new_tokens forbids it. Known here for a regex
(its automaton, interegular's) and for choices. What cannot be known before the step (a schema's
shape against the tokenizer) fails only that request there, with a clear reason (scheduler:
NoAllowedTokenError -> a 400 finish)."""

from __future__ import annotations

import functools

# longer patterns are left to the step's check (building the automaton costs)
MAX_CHECKED_REGEX_CHARS = 2000


@functools.lru_cache(maxsize=256)
def longest_match_chars(regex: str) -> int | None:
    """The most characters a full match of regex can have; None when unbounded or unknown."""
    if len(regex) > MAX_CHECKED_REGEX_CHARS:
        return None
    try:
        import interegular

        fsm = interegular.parse_pattern(regex).to_fsm()
    except Exception:  # noqa: BLE001
        # syntax outlines/llguidance accept and interegular does not: no verdict here
        return None
    succ = {s: set(fsm.map.get(s, {}).values()) for s in fsm.states}
    live = set(fsm.finals)  # states from which a final state is reachable
    changed = True
    while changed:
        changed = False
        for s, nxt in succ.items():
            if s not in live and nxt & live:
                live.add(s)
                changed = True
    if fsm.initial not in live:
        return 0  # nothing matches: the backend's own check refuses it
    longest: dict[int, int] = {}
    visiting: set[int] = set()

    def walk(s: int) -> int | None:  # longest path from s to a final state; None on a live cycle
        if s in longest:
            return longest[s]
        if s in visiting:
            return None
        visiting.add(s)
        best = 0 if s in fsm.finals else -1
        for t in succ[s] & live:
            sub = walk(t)
            if sub is None:
                return None
            best = max(best, sub + 1)
        visiting.discard(s)
        longest[s] = best
        return best

    try:
        return walk(fsm.initial)
    except RecursionError:
        return None


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
