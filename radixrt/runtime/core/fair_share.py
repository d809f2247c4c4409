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
- **Time.** A step's tokens (one per decode row, the prefill tokens of extends) are shared out by
  water-filling: each client gets min(its demand, L) for the largest level L whose step still fits
  a cost cap, FAIR_STEP_FACTOR times what the lightest client's own tokens cost alone, or what every
  client's equal share costs together if that is more. What a step of n tokens costs is measured as
  the server runs (step_costs.py), so the rule is the same on every machine: where 8 rows cost
  barely more than 2 (a GPU, a decode bound by reading the weights) nothing is held back; where
  each row costs (a 2-core CPU) a flood's rows take turns. A decode row past its client's share
  pauses for the step, keeping its pages and row (the least recently stepped go first); a prefill
  past it goes on in a later step.

A client that had work within RECENT_S still counts, with one token of demand: a client between two
requests of a conversation is not absent, and the next step would otherwise be the flood's alone.
`--disable-fair-share` turns both rules off (turns stay).
"""

from __future__ import annotations

import time
from typing import Callable, Hashable

from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.step_costs import StepCosts

FAIR_STEP_FACTOR = 1.5
RECENT_S = 1.0
MAX_RECENT_CLIENTS = 4096  # clients remembered as recent (the oldest forgotten first)

Client = Hashable


def rows_by_client(running: list[Req]) -> dict[Client, int]:
    """Table rows each client's running requests hold: one each, a beam search its width once."""
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
    """Rows req's unit holds: a beam search its width, else one."""
    return req.beam.root.sampling.beam_width if req.beam is not None else 1


def water_fill(demand: dict[Client, int], cost: Callable[[int], float | None],
               factor: float = FAIR_STEP_FACTOR) -> dict[Client, int] | None:  # fmt: skip
    """Tokens each client may feed this step (see the module's docstring); None: no limit (fewer
    than two clients, or no cost measured yet). demand: client -> tokens wanted (> 0)."""
    if len(demand) < 2:
        return None
    light = min(demand.values())
    c_light, c_equal = cost(light), cost(light * len(demand))
    if c_light is None or c_equal is None:
        return None
    cap = max(factor * c_light, c_equal)
    lo, hi = light, max(demand.values())
    while lo < hi:  # the largest level whose step fits the cap (the cost rises with the level)
        mid = (lo + hi + 1) // 2
        if (cost(sum(min(d, mid) for d in demand.values())) or 0.0) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return {c: min(d, lo) for c, d in demand.items()}


class FairShare:
    def __init__(self, enabled: bool, preempt: Callable[[Req], None], chunk: int):
        """preempt: the scheduler's (the request's memory back, it waits again). chunk: the most
        prefill tokens of one step (--chunked-prefill-size)."""
        self.enabled = enabled
        self.costs = StepCosts()
        self._preempt = preempt
        self._chunk = chunk
        self._recent: dict[Client, float] = {}  # client -> when it last had work (monotonic)
        self._last_step: dict[int, int] = {}  # id(req) -> the forward it last decoded in
        self._credit: dict[
            Client, int
        ] = {}  # tokens a client saved up for a unit larger than its share
        self._forward = 0
        self.shares: dict[Client, int] | None = None  # this step's (None: no limit)

    # ------------------------------------------------------------ the step's shares
    def plan(self, running: list[Req], waiting: list[Req]) -> None:
        """This step's token shares, from what each client wants of it."""
        self._forward += 1
        self.shares = None
        if not self.enabled:
            return
        if (
            len(self._last_step) > 2 * len(running) + 64
        ):  # requests gone since (finished, preempted)
            live = {id(r) for r in running}
            self._last_step = {k: v for k, v in self._last_step.items() if k in live}
        demand = self._demand(running, waiting)
        if len(demand) > 1:
            self.shares = water_fill(demand, self.costs.estimate)

    def _demand(self, running: list[Req], waiting: list[Req]) -> dict[Client, int]:
        now = time.monotonic()
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
                prefill[r.options.client] = prefill.get(r.options.client, 0) + r.seq_len
        demand = {c: decode.get(c, 0) + min(prefill.get(c, 0), self._chunk)
                  for c in decode.keys() | prefill.keys()}  # fmt: skip
        for c in demand:
            self._recent.pop(c, None)
            self._recent[c] = now  # (re-inserted: the dict stays oldest first)
        while self._recent and (
            len(self._recent) > MAX_RECENT_CLIENTS
            or next(iter(self._recent.values())) < now - RECENT_S
        ):
            del self._recent[next(iter(self._recent))]
        for c in self._recent:
            demand.setdefault(c, 1)  # a client between two requests is not absent
        return demand

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
