"""#56.5: a step shared across clients (core/fair_share.py, core/step_costs.py). Truths: a brute
force over every level for the water-filling; the step costs' points against a median taken by
hand; on the real scheduler with the fake runner (output a pure function of the tokens), which
requests each planned step holds, every output equal to that request's output alone, and every
page back."""

from __future__ import annotations

import random

import pytest
from fake_runner import FakeRunner
from test_scheduler import VOCAB, assert_all_pages_back, drain, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import fair_share
from radixrt.runtime.core.fair_share import FairShare, water_fill
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.core.step_costs import StepCosts
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sampling_params import SamplingParams


class CurveCosts(StepCosts):
    """A machine whose steps cost what `curve` says."""

    def __init__(self, curve):
        super().__init__()
        self.curve = curve

    def record(self, tokens: int, seconds: float, extends: bool = False, verifies=False) -> None:
        pass

    def estimate(self, tokens: int, extends: bool = False) -> float:
        return self.curve(tokens, extends)


def decoding_req(rid: str, client: str) -> Req:
    r = Req(rid, [1, 2, 3], SamplingParams(), RequestOptions(client=client))
    r.output_ids, r.kv.computed_len = [4], 3
    return r


# ------------------------------------------------------------------ the parts
def test_step_costs_interpolate_never_fall_and_shrug_off_one_slow_step():
    costs = StepCosts()
    assert costs.estimate(8) is None
    for _ in range(5):
        costs.record(2, 0.010)
        costs.record(64, 0.030)
        costs.record(16, 0.050, extends=True)
    costs.record(2, 5.0)  # a graph compiled on first use: one slow step of the bin
    assert costs.estimate(2) == 0.010 and costs.estimate(1) == 0.010
    assert abs(costs.estimate(33) - 0.020) < 1e-12  # halfway between the two points
    assert abs(costs.estimate(128) - 0.060) < 1e-12  # in proportion past the last point
    costs.record(512, 0.001)  # a faster big step than a small one (noise): the cost never falls
    assert costs.estimate(512) >= costs.estimate(64)
    assert costs.estimate(16, extends=True) == 0.050  # a prompt chunk's steps apart
    assert costs.estimate(600, extends=True) >= costs.estimate(600)  # never below decodes


def brute_fill(demand: dict, cost, credit: float, factor: float) -> tuple[dict, float]:
    """water_fill's contract, level by level: the lightest clients whole, the others at the largest
    level whose step fits the cap plus the credit (the lightest's tokens when none does and the
    credit is at its most)."""
    total = {c: d + p for c, (d, p) in demand.items()}
    light = min(total.values())

    def shares(level):
        return {c: t if t == light else min(t, level) for c, t in total.items()}

    def step(level):
        sh = shares(level)
        return cost(sum(sh.values()), any(sh[c] > demand[c][0] for c in sh))

    cap = factor * step(0)
    credit = min(credit, fair_share.CREDIT_STEPS * cap)  # at most CREDIT_STEPS of this cap
    fits = [lv for lv in range(max(total.values()) + 1) if step(lv) <= cap + credit]
    best = max(fits, default=0)  # in debt, even level 0 is past it: the lightest alone
    if best == 0 and credit >= fair_share.CREDIT_STEPS * cap:
        best = light
    return shares(best), cap


def test_water_fill_matches_a_brute_force_over_every_level():
    rng = random.Random(7)
    curves = [
        lambda n, ext: 1.0 + n + (40.0 if ext else 0.0),
        lambda n, ext: 10.0 + n * 0.1,
        lambda n, ext: 5.0 + (n / 8) ** 2 + (3.0 if ext else 0.0),
    ]
    for trial in range(400):
        cost = curves[trial % 3]
        demand = {
            f"c{i}": (rng.randint(0, 8), rng.choice([0, 0, rng.randint(1, 600)]))
            for i in range(rng.randint(2, 5))
        }
        demand = {c: d if sum(d) else (1, 0) for c, d in demand.items()}
        credit = rng.choice([0.0, 5.0, 400.0, -3.0])
        got = water_fill(demand, cost, credit, 1.5)
        want = brute_fill(demand, cost, credit, 1.5)
        assert got[0] == want[0] and abs(got[1] - want[1]) < 1e-9, (demand, credit, got, want)


def test_a_prompt_chunk_waits_for_saved_up_time_and_the_steps_average_within_the_cap():
    # a 2-row client beside a flood's prompt: a step of decodes costs 14 + n, any chunk 50 more
    def cost(n, ext):
        return (14.0 + n + (50.0 if ext else 0.0)) / 1e3

    fs = FairShare(True, lambda r: None, 512)
    fs.costs = CurveCosts(cost)
    polite = decoding_req("p", "polite"), decoding_req("q", "polite")
    flood = Req("f", list(range(300)), SamplingParams(), RequestOptions(client="flood"))
    spent, chunks = [], 0
    for _ in range(200):
        fs.plan(list(polite), [flood])
        took = cost(sum(fs.shares.values()), fs.shares["flood"] > 0)
        fs.record(0, took, False)  # (what the step took: here exactly its cost)
        spent.append(took)
        chunks += fs.shares["flood"] > 0
    cap = 1.5 * cost(2, False)
    assert chunks >= 10  # the flood's prompt goes on, now and then
    assert sum(spent) / len(spent) <= cap + 1e-9  # on average no step past the cap
    assert max(spent) <= cap * (1 + fair_share.CREDIT_STEPS) + 1e-9


def test_water_fill_leaves_one_client_and_an_unmeasured_machine_alone():
    assert water_fill({"a": (0, 500)}, lambda n, e: float(n)) is None
    assert water_fill({"a": (0, 500), "b": (2, 0)}, lambda n, e: None) is None
    # where a step's cost barely grows with its tokens (a GPU), nobody is held back
    shares, _ = water_fill({"a": (0, 500), "b": (2, 0)}, lambda n, e: 1.0 + n * 1e-4)
    assert shares == {"a": 500, "b": 2}


# ------------------------------------------------------------------ on the scheduler
def make(**cfg) -> Scheduler:
    config = ServerConfig(page_size=1, chunked_prefill_size=512, max_running_requests=4, **cfg)
    return Scheduler(config, FakeRunner(4000, 1, VOCAB, eos=None, max_rows=17))


@pytest.fixture(autouse=True)
def factor_of_one_and_a_half(monkeypatch):
    """The arithmetic below is the mechanism's, at a factor of 1.5 (the default may move)."""
    monkeypatch.setattr(fair_share, "FAIR_STEP_FACTOR", 1.5)


def on_linear_machine(s: Scheduler) -> Scheduler:
    """s's steps cost exactly what LinearCosts says (the fake runner's own times are microseconds
    of noise)."""
    s.fair.costs = LinearCosts()
    real = s.fair.record
    s.fair.record = lambda tokens, _s, extends, verifies=False: real(tokens, 1.0 + tokens, extends)
    return s


class LinearCosts(StepCosts):
    """A machine where every token of a step costs the same (1 + n units): the fake runner's own
    times are microseconds of noise."""

    def record(self, tokens: int, seconds: float, extends: bool = False, verifies=False) -> None:
        pass

    def estimate(self, tokens: int, extends: bool = False) -> float:
        return 1.0 + tokens


def send(s, rid, client, prompt_len=12, new=8):
    seed = sum(ord(ch) * 31**i for i, ch in enumerate(rid))  # no two rids share a prompt
    prompt = [3 + (seed + k * 7) % 40 for k in range(prompt_len)]
    s.add_request(
        TokenizedGenerateReq(
            rid=rid,
            input_ids=prompt,
            sampling_params={"max_new_tokens": new},
            options=RequestOptions(client=client),
        )
    )


def step_taking(s, outs):
    """One step; the rids of its plan's items and the tokens each fed."""
    fed: dict[str, int] = {}
    real_run = s.runner.run

    def run(items, masks):
        for req, item in zip(plan_reqs, items):
            fed[req.rid] = len(item.new_ids)
        return real_run(items, masks)

    real_plan = s._plan

    def plan():
        p = real_plan()
        plan_reqs[:] = p.reqs
        return p

    plan_reqs: list = []
    s._plan, s.runner.run = plan, run
    try:
        s.step()
    finally:
        s._plan, s.runner.run = real_plan, real_run
    for o in s.take_outputs():
        outs.setdefault(o.rid, []).append(o)
    s.check_integrity()
    return fed


def test_a_flood_gives_a_row_back_and_shares_each_step():
    s = on_linear_machine(make())
    outs: dict = {}
    for i in range(4):
        send(s, f"f{i}", "addr:flood", prompt_len=12, new=40)
    step_taking(s, outs)  # the flood alone: all four rows, whole prompts
    assert {r.rid for r in s.running} == {"f0", "f1", "f2", "f3"}
    send(s, "p0", "addr:polite", prompt_len=6, new=8)
    fed = step_taking(s, outs)
    # the rows were full: the flood's newest request gave its row back (its KV into the tree: it
    # waits with one token to compute), so the flood wants 3 rows + 1 token, the lightest client;
    # the polite prompt runs at the largest level that fits the cap 1.5 * cost(4) = 7.5: 2 tokens
    assert fed.get("p0") == 2 and "f3" not in fed, fed
    assert [r.rid for r in s.waiting] == ["f3"]
    polite_steps = 0
    while s.has_work():
        p0 = next((r for r in s.running if r.rid == "p0"), None)
        decoding = p0 is not None and p0.is_decoding
        fed = step_taking(s, outs)
        if decoding:
            polite_steps += 1
            flood = sum(n for rid, n in fed.items() if rid != "p0")
            # cap = 1.5 * cost(1) = 3 units: one flood token beside the polite one
            assert fed["p0"] == 1 and flood <= 1, fed
    assert polite_steps == 7  # p0 decoded in every step until its 8 tokens were out
    for rid in ["p0", "f0", "f3"]:
        alone = make()
        send(alone, rid, "addr:polite" if rid == "p0" else "addr:flood", 6 if rid == "p0" else 12,
             8 if rid == "p0" else 40)  # fmt: skip
        assert ids(outs, rid) == ids(drain(alone), rid), rid
    assert_all_pages_back(s)


def test_disable_fair_share_keeps_the_flood_in_every_row():
    s = on_linear_machine(make(disable_fair_share=True))
    outs: dict = {}
    for i in range(4):
        send(s, f"f{i}", "addr:flood", new=40)
    step_taking(s, outs)
    send(s, "p0", "addr:polite", prompt_len=6)
    fed = step_taking(s, outs)
    assert "p0" not in fed and set(fed) == {"f0", "f1", "f2", "f3"}
    drain(s, outs)
    assert_all_pages_back(s)


def test_a_beam_search_larger_than_its_share_saves_up_and_runs_whole():
    from types import SimpleNamespace

    def req(rid, client, beam=None):
        r = Req(rid, [1, 2, 3], SamplingParams(), RequestOptions(client=client))
        r.beam = beam
        return r

    group = SimpleNamespace(root=SimpleNamespace(sampling=SimpleNamespace(beam_width=4)))
    beams = [req(f"b{i}", "flood", group) for i in range(4)]
    polite = [req("p0", "polite"), req("p1", "polite")]
    fs = FairShare(True, lambda r: None, 512)
    ran = []
    for _ in range(8):
        fs._forward += 1
        fs.shares = {"polite": 2, "flood": 1}  # one token a step for the flood's four beams
        picked = fs.pick_decodes(polite + beams)
        assert picked[:2] == polite  # the polite rows every step
        assert picked[2:] in ([], beams)  # the beams all together or none
        ran.append(bool(picked[2:]))
        assert fs.shares["flood"] == 0  # nothing left of the share for its prompts meanwhile
    assert ran == [False, False, False, True] * 2


def test_the_credit_follows_what_steps_really_took():
    fs = FairShare(True, lambda r: None, 512)
    fs.costs = LinearCosts()  # 1 + n units a step, whatever it holds
    flood = Req("f", list(range(100)), SamplingParams(), RequestOptions(client="flood"))
    fs.plan([decoding_req("p", "polite")], [flood])
    assert fs.shares == {"polite": 1, "flood": 1}  # cap 1.5 * (1 + 1) = 3: one flood token
    fs.record(2, 10.0, True)  # the step took 10 units against its cap of 3: 7 owed
    assert fs._time_credit == -7.0
    fs.plan([decoding_req("p", "polite")], [flood])
    assert fs.shares == {"polite": 1, "flood": 0}  # in debt: the flood waits
    fs.record(1, 2.0, False)  # a step of the polite row alone: 1 of the debt paid back
    assert fs._time_credit == -6.0


def test_a_mostly_cached_prompt_is_a_light_client_and_holds_the_others_to_its_step():
    """A polite request whose prompt the cache holds but for one token computes one token: the
    flood is held to a step of about that size, not to one of the whole prompt's tokens."""
    cached = {"p": 99, "f": 0}
    fs = FairShare(True, lambda r: None, 512, cached=lambda r: cached[r.rid])
    fs.costs = LinearCosts()  # 1 + n units
    polite = Req("p", list(range(100)), SamplingParams(), RequestOptions(client="polite"))
    flood = Req("f", list(range(300)), SamplingParams(), RequestOptions(client="flood"))
    fs.plan([], [polite, flood])
    assert fs.shares == {"polite": 1, "flood": 1}  # cap 1.5 * (1 + 1) = 3: one flood token
    cached["p"] = 0  # guessed once while it waits: the table is not read again
    fs.plan([], [polite, flood])
    assert fs.shares == {"polite": 1, "flood": 1}
    polite.move_to(ReqStatus.RUNNING)
    polite.move_to(ReqStatus.WAITING)  # preempted: guessed again
    fs.plan([], [polite, flood])
    assert fs.shares == {"polite": 100, "flood": 50}  # cap 1.5 * 101: 50 flood tokens beside it


def test_a_lone_client_keeps_its_steps_short_while_another_is_between_requests(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(fair_share.time, "monotonic", lambda: now[0])
    fs = FairShare(True, lambda r: None, 512)
    fs.costs = LinearCosts()  # 1 + n units
    flood = Req("f", list(range(300)), SamplingParams(), RequestOptions(client="flood"))
    fs.plan([], [flood])
    assert fs.shares is None  # nobody else was here: the whole step
    fs.plan([decoding_req("p", "polite")], [flood])  # the polite client's request decodes
    now[0] += fair_share.RECENT_S / 2
    fs.plan([], [flood])  # it ended; its next one is on its way
    # a step of at most (1 + CREDIT_STEPS) shared caps of a decode row: 1 + n <= 4 * 1.5 * 2
    assert fs.shares == {"flood": 11}
    now[0] += fair_share.RECENT_S
    fs.plan([], [flood])
    # gone for longer than RECENT_S but still about: a quarter of a chunk at most
    assert fs.shares == {"flood": 512 // fair_share.PRESENT_CHUNK_PART}
    fs.plan([decoding_req("f2", "flood")], [flood])
    assert fs.shares == {"flood": 1 + 512 // fair_share.PRESENT_CHUNK_PART}  # its decodes too
    small = Req("s", list(range(100)), SamplingParams(), RequestOptions(client="flood"))
    fs.plan([], [small])
    assert fs.shares is None  # a prompt within the quarter: nothing to hold back
    now[0] += fair_share.PRESENT_S
    fs.plan([], [flood])
    assert fs.shares is None  # nobody else for longer than PRESENT_S: the whole step again
