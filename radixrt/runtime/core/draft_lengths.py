"""How many speculative draft tokens a step verifies, decided for all drafting requests together
(#57: a batch never slower than without drafts).

A draft token costs a row of the step whether the model agrees with it or not, and pays only when
it does. Where a step's cost grows with its rows (a 2-core CPU: 2 decode rows 14 ms, 8 rows 26 ms)
verifying every guess of a wide batch makes the batch slower than decoding without drafts; where
rows are almost free (a GPU, one stream bound by reading the weights) every guess pays. Deciding
per request fails: sixteen requests each adding four tokens are each costed as four, not as the
sixty-four the step grows by. So each step the drafts are cut to the total E of extra rows that
maximises the step's expected tokens per second, (rows + the expected accepted tokens of the E
most likely draft tokens) / cost(rows + E), on the curves the server measures (step_costs.py: a
step that verifies drafts leaves the whole-step graph, so it has its own curve). E = 0 is a
candidate, so the expected rate never falls below no drafts.

A request's j-th draft token (from 1) is accepted only if every one before it was: with p the
request's acceptance so far (tokens accepted / (accepted + tokens the model disagreed with), a
one-and-one prior), its worth is p^j, and the E tokens of most worth are kept (a request's first
tokens before its later ones). What is not known yet is tried, so that it becomes known: in a step
of at most EXPLORE_ROWS decoding requests, a request that has verified no draft yet verifies its
first whole (its rows count in the step; in a wider step every request's first guess would widen it
at once, and the prior judges them), and row counts the curve has not measured cost what the
largest measured one does. Grammar drafts (forced text, nearly always accepted) are left alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from radixrt.runtime.core.req import Req

# seconds of a decode step of n tokens, verifying drafts or not (None: not measured)
Cost = Callable[[int, bool], float | None]
EXPLORE_ROWS = 4  # the widest step in which a request's first draft is verified whole


def acceptance(req: Req) -> float:
    """The chance req's next draft token is accepted, from its verify steps so far."""
    return (req.spec_accepted + 1) / (req.spec_accepted + req.spec_missed + 2)


def _cut(req: Req, rows: int) -> bool:
    """Whether req's draft is one this rule may cut in a step of `rows` decoding requests:
    speculative, and not its first in a narrow step."""
    return req.grammar is None and (req.spec_verify_ct > 0 or rows > EXPLORE_ROWS)


def paying_total(worths: list[float], rows: int, cost: Cost, verifying: bool = False) -> int | None:
    """The number of draft tokens (worths sorted from most to least) that maximises the step's
    expected tokens per second (verifying: the step verifies drafts anyway); None when nothing is
    measured (keep every draft)."""
    base = cost(rows, verifying)
    if base is None:
        return None
    best, best_rate, gained = 0, rows / base, 0.0
    for extra, worth in enumerate(worths, 1):
        gained += worth
        rate = (rows + gained) / (cost(rows + extra, True) or base)
        if rate > best_rate:
            best, best_rate = extra, rate
    return best


def cut_drafts(ready: list[Req], cost: Cost) -> None:
    """Cut the speculative drafts of a step's decoding requests to the total that pays."""
    worths = [
        (acceptance(r) ** j, i)
        for i, r in enumerate(ready)
        if _cut(r, len(ready))
        for j in range(1, len(r.draft_ids) + 1)
    ]
    if not worths:
        return
    worths.sort(key=lambda w: -w[0])
    tried = sum(len(r.draft_ids) for r in ready if not _cut(r, len(ready)))
    total = paying_total([w for w, _ in worths], len(ready) + tried, cost, tried > 0)
    if total is None:
        return
    keep = Counter(i for _, i in worths[:total])
    for i, r in enumerate(ready):
        if _cut(r, len(ready)) and len(r.draft_ids) > keep[i]:
            r.draft_ids, r.draft_states = r.draft_ids[: keep[i]], r.draft_states[: keep[i]]
