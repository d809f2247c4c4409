"""A fair share of each step across clients (#56.5): one client's flood (many requests, beam
searches, long prompts) must not make every token of another client wait on it.

Admission already takes turns across clients (schedule_policy.order_waiting); that helps only when
a row frees, and a flood's rows and prefill chunks make every step slower for everyone. Two rules
more, both idle while one client has work (its requests keep the policy's order and steps as large
as the budget allows):

- **Rows.** A waiting request that finds every row taken, while another client runs more rows than
  its own client would after it starts, takes a row from that client: the other client's newest
  request is preempted (its KV goes into the tree, so it resumes mostly cached; a beam search
  restarts whole).
- **Time.** A step's tokens (one per decode row, the prompt tokens of extends) are shared out by
  water-filling (water_fill): the lightest clients get all they want, every other client min(its
  demand, L) for the largest level L whose step still fits FAIR_STEP_FACTOR times the lightest
  clients' own step, plus the headroom saved up while someone was held back (so that a prompt
  chunk, far dearer than a decode row, runs now and then; on average the steps keep within the
  cap). What a step costs is measured as the server runs (step_costs.py), so the rule is the same
  on every machine: where 8 rows cost barely more than 2 (a GPU, a decode bound by reading the
  weights) nothing is held back; where each row costs (a 2-core CPU) a flood's rows take turns. A
  decode row past its client's share pauses for the step, keeping its pages and row (the least
  recently stepped go first); a prompt past it goes on in a later step.

A client alone keeps the whole step unless another had work within RECENT_S: then its step stays
within what one shared step may take, so the other's next request (most likely on its way) does not
wait behind a whole prompt chunk. While another client had work within PRESENT_S (it is still
using the server, between two of its turns), a lone client's prompt chunk is a PRESENT_CHUNK_PART
of the chunk at most: a request that arrives then waits for a quarter of a chunk, not a whole one
(~1.3 s of a 512-token chunk on a 2-core CPU), at a few percent of the lone client's prefill rate
(one more fixed per-step cost each quarter) and only while someone else is about.
`--disable-fair-share` turns both rules off (turns stay).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Hashable

from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.step_costs import StepCosts

FAIR_STEP_FACTOR = 1.25
RECENT_S = 1.0  # a client with work this recently is between two requests, not gone
PRESENT_S = 30.0  # ... this recently: still using the server
PRESENT_CHUNK_PART = 4  # a lone client's chunk is at most 1/4 of one while another is present
MAX_RECENT_CLIENTS = 1024
CREDIT_STEPS = 3  # the most time a held-back client saves up, in caps (a burst: one step)

Client = Hashable
log = logging.getLogger(__name__)


def rows_by_client(running: list[Req]) -> dict[Client, int]:
    """Table rows each client's running requests hold or are promised: one each, a beam search its
    width once (whichever of its beams run)."""
    rows: dict[Client, int] = {}
    seen: set[int] = set()
    for r in running:
        if r.beam is not None:
            if id(r.beam) in seen:
                continue
            seen.add(id(r.beam))
        rows[r.options.client] = rows.get(r.options.client, 0) + unit_rows(r)
    return rows


def unit_rows(req: Req) -> int:
    """Rows req's unit holds: its beam search's width (the root's), else its own."""
    return (req.beam.root if req.beam is not None else req).rows


Demand = tuple[int, int]  # what a client wants of a step: (decode rows, prompt tokens)


def water_fill(
    demand: dict[Client, Demand],
    cost: Callable[[int, bool], float | None],
    credit: float = 0.0,
    factor: float | None = None,
) -> tuple[dict[Client, int], float] | None:
    """(tokens each client may feed this step, the step's cap in seconds); None: no limit (fewer
    than two clients, or no cost measured yet). cost(tokens, extends): a step's seconds (extends:
    with a prompt chunk in it).

    The lightest clients (fewest tokens wanted) get all they want; every other client min(its
    tokens, L), decodes first, for the largest L whose step fits the cap (FAIR_STEP_FACTOR times the
    lightest clients' own step) plus `credit`, the headroom earlier steps left (FairShare.record);
    when nothing fits even the most credit there is, every client gets the lightest's tokens."""
    if len(demand) < 2:
        return None
    total = {c: d + p for c, (d, p) in demand.items()}
    light = min(total.values())

    def step(level: int) -> float | None:
        tokens, extends = 0, False
        for c, t in total.items():
            n = t if t == light else min(t, level)
            tokens += n
            extends |= n > demand[c][0]
        return cost(tokens, extends)

    base = step(0)  # the lightest clients' own step
    if base is None:
        return None
    cap = (FAIR_STEP_FACTOR if factor is None else factor) * base
    credit = min(credit, CREDIT_STEPS * cap)  # saved under a larger cap: this step's bound
    lo, hi = 0, max(total.values())
    while lo < hi:  # the largest level whose step fits (the cost rises with the level)
        mid = (lo + hi + 1) // 2
        if (step(mid) or 0.0) <= cap + credit:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0 and credit >= CREDIT_STEPS * cap:
        lo = light  # nothing fits even the most time saved up: the lightest's tokens each, once
    return {c: t if t == light else min(t, lo) for c, t in total.items()}, cap


class FairShare:
    def __init__(
        self,
        enabled: bool,
        preempt: Callable[[Req], None],
        chunk: int,
        cached: Callable[[Req], int] = lambda r: 0,
    ):
        """preempt: the scheduler's (the request's memory back, it waits again). chunk: the most
        prefill tokens of one step (--chunked-prefill-size). cached: how many of a waiting
        request's tokens the cache holds (a read-only guess; its prefill computes the rest)."""
        self.enabled = enabled
        self._cached = cached
        self.costs = StepCosts()
        self._preempt = preempt
        self._chunk = chunk
        self._last_step: dict[int, int] = {}  # id(req) -> the forward it last decoded in
        # tokens a client saved up for a unit larger than its share (pick_decodes)
        self._credit: dict[Client, int] = {}
        # seconds of headroom saved up while someone was held back (record), and this step's cap
        self._time_credit = 0.0
        self._cap: float | None = None
        self._recent: dict[Client, float] = {}  # client -> when it last had work (monotonic)
        self._forward = 0
        self.shares: dict[Client, int] | None = None  # this step's (None: no limit)

    # ------------------------------------------------------------ the step's shares
    def plan(self, running: list[Req], waiting: list[Req]) -> None:
        """This step's token shares, from what each client wants of it."""
        self._forward += 1
        self.shares, self._cap = None, None
        if not self.enabled:
            return
        if len(self._last_step) > 2 * len(running) + 64:  # requests gone since (ended, preempted)
            live = {id(r) for r in running}
            self._last_step = {k: v for k, v in self._last_step.items() if k in live}
        demand = self._demand(running, waiting)
        if len(demand) == 1:
            self.shares = self._lone_share(demand)
            return
        filled = water_fill(demand, self.costs.estimate, self._time_credit)
        if filled is None:
            self._time_credit = 0.0
            return
        self._seen(demand)
        self.shares, cap = filled
        if any(self.shares[c] < d + p for c, (d, p) in demand.items()):
            self._cap = cap  # someone is held back: the step's time counts against the cap
        else:
            self._time_credit = 0.0
        log.debug("step %d: demand %s, shares %s", self._forward, demand, self.shares)

    def _lone_share(self, demand: dict[Client, Demand]) -> dict[Client, int] | None:
        """One client has work while another had some within RECENT_S (between two of its requests,
        most likely): the lone client's step stays within the most one shared step may take (a
        decode row's cap plus the most credit), so the other's next request does not wait behind a
        whole prompt chunk. Another had work within PRESENT_S: its prompt tokens are at most
        1/PRESENT_CHUNK_PART of a chunk. None (no limit) once nobody else is about."""
        now = time.monotonic()
        ((client, (decodes, prompt)),) = demand.items()
        ago = [now - t for c, t in self._recent.items() if c != client]
        self._seen(demand)
        self._time_credit = 0.0
        if not ago or min(ago) > PRESENT_S:
            return None
        if min(ago) > RECENT_S:
            if prompt <= self._chunk // PRESENT_CHUNK_PART:
                return None
            return {client: decodes + max(1, self._chunk // PRESENT_CHUNK_PART)}
        one_row = self.costs.estimate(1, False)
        if one_row is None:
            return None
        bound = (1 + CREDIT_STEPS) * FAIR_STEP_FACTOR * one_row
        lo, hi = 1, decodes + prompt
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (self.costs.estimate(mid, mid > decodes) or 0.0) <= bound:
                lo = mid
            else:
                hi = mid - 1
        return {client: lo}

    def _seen(self, demand: dict[Client, Demand]) -> None:
        """The clients with work now are recent; the table keeps the MAX_RECENT_CLIENTS latest."""
        now = time.monotonic()
        for c in demand:
            self._recent[c] = now
        if len(self._recent) > MAX_RECENT_CLIENTS:
            latest = sorted(self._recent.items(), key=lambda kv: kv[1])[-MAX_RECENT_CLIENTS // 2 :]
            self._recent = dict(latest)

    def record(self, tokens: int, seconds: float, extends: bool, verifies: bool = False) -> None:
        """The step ran: its cost goes on the curves, and while someone is held back what it took
        comes off the credit and its cap goes on, so the steps keep within the cap on average as
        measured (the estimates know tokens, not the attention over long contexts nor the load
        from other processes), and a step past the cap is paid back by the next ones."""
        self.costs.record(tokens, seconds, extends, verifies)
        if self._cap is not None:
            bound = CREDIT_STEPS * self._cap
            self._time_credit = max(-bound, min(bound, self._time_credit + self._cap - seconds))
            self._cap = None

    def _demand(self, running: list[Req], waiting: list[Req]) -> dict[Client, Demand]:
        """Each client with work: (its decoding rows, the prompt tokens its extends and waiting
        requests could use this step, at most a chunk; a waiting prompt's cached prefix aside: a
        request whose prompt is mostly cached is a light client's, and the step the others are
        held to is the one it runs)."""
        prefill: dict[Client, int] = {}
        decode: dict[Client, int] = {}
        for r in running:
            c = r.options.client
            if r.is_decoding:
                decode[c] = decode.get(c, 0) + 1
            elif r.status is ReqStatus.RUNNING:
                prefill[c] = prefill.get(c, 0) + r.seq_len - r.kv.computed_len
        for r in waiting:
            if r.status is ReqStatus.WAITING:
                if r.uncached_hint is None:  # guessed once while it waits: O(prompt) once
                    r.uncached_hint = max(1, r.seq_len - self._cached(r))
                prefill[r.options.client] = prefill.get(r.options.client, 0) + r.uncached_hint
        return {
            c: (decode.get(c, 0), min(prefill.get(c, 0), self._chunk))
            for c in decode.keys() | prefill.keys()
        }

    def pick_decodes(self, ready: list[Req]) -> list[Req]:
        """The decoding requests that run this step (the others pause, keeping pages and row): per
        client, units (a request, or a beam search's beams together) least recently stepped first
        while its share lasts. A unit larger than what is left waits for credit, deficit round
        robin: the client's share is saved up over steps (its prompts get none meanwhile) until the
        unit fits, so a beam search of width 4 on a share of 1 runs every fourth step. Their tokens
        come off the shares."""
        if self.shares is None:
            self._credit.clear()
            return ready
        units: dict[int, list[Req]] = {}
        for r in ready:
            units.setdefault(id(r.beam) if r.beam is not None else id(r), []).append(r)
        order = sorted(units.values(), key=lambda u: min(self._last_step.get(id(r), 0) for r in u))
        credit, self._credit = self._credit, {}
        owed: set[Client] = set()
        taken: list[Req] = []
        for unit in order:
            c = unit[0].options.client
            if c in owed:
                continue  # its client saves up for an earlier unit
            left = self.shares.get(c, 0) + credit.pop(c, 0)
            if left < len(unit):
                owed.add(c)
                self._credit[c], self.shares[c] = left, 0
                continue
            self.shares[c] = left - len(unit)
            for r in unit:
                self._last_step[id(r)] = self._forward
            taken.extend(unit)
        kept = {id(r) for r in taken}
        return [r for r in ready if id(r) in kept]  # in the order they came

    def budget(self, req: Req, budget: int) -> int:
        """Prefill tokens req may compute this step within the step's budget."""
        if self.shares is None:
            return budget
        return max(0, min(budget, self.shares.get(req.options.client, 0)))

    def spend(self, req: Req, tokens: int) -> None:
        if self.shares is not None and tokens > 0:
            c = req.options.client
            self.shares[c] = self.shares.get(c, 0) - tokens

    # ------------------------------------------------------------ rows
    def take_row(self, req: Req, running: list[Req]) -> bool:
        """The rows are full and req waits: take a row for it from the client running the most
        rows, if that client would still run at least as many as req's after (True: one of its
        requests was preempted; count the rows again)."""
        rows = rows_by_client(running)
        mine = rows.get(req.options.client, 0)
        others = [(n, c) for c, n in rows.items() if c != req.options.client]
        if not others:
            return False
        most, client = max(others, key=lambda x: x[0])
        theirs = [
            r for r in running if r.options.client == client and r.status is ReqStatus.RUNNING
        ]
        plain = [r for r in theirs if r.beam is None]
        pool = plain or theirs
        if not pool:
            return False
        victim = max(pool, key=lambda r: (r.arrival_time, -len(r.output_ids)))
        if mine + unit_rows(req) > most - unit_rows(victim):
            return False
        self._preempt(victim)
        return True
