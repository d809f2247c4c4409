"""#56.5: a step shared across clients (core/fair_share.py, core/step_costs.py). Truths: a brute
force over every level for the water-filling; the step costs' points against a median taken by
hand; on the real scheduler with the fake runner (output a pure function of the tokens), which
requests each planned step holds, every output equal to that request's output alone, and every
page back."""

from __future__ import annotations

import random

from fake_runner import FakeRunner
from test_scheduler import VOCAB, assert_all_pages_back, drain, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core import fair_share
from radixrt.runtime.core.fair_share import water_fill
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.core.step_costs import StepCosts
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions


# ------------------------------------------------------------------ the parts
def test_step_costs_interpolate_never_fall_and_shrug_off_one_slow_step():
    costs = StepCosts()
    assert costs.estimate(8) is None
    for _ in range(5):
        costs.record(2, 0.010)
        costs.record(64, 0.030)
    costs.record(2, 5.0)  # a graph compiled on first use: one slow step of the bin
    assert costs.estimate(2) == 0.010 and costs.estimate(1) == 0.010
    assert abs(costs.estimate(33) - 0.020) < 1e-12  # halfway between the two points
    assert abs(costs.estimate(128) - 0.060) < 1e-12  # in proportion past the last point
    costs.record(512, 0.001)  # a faster big step than a small one (noise): the cost never falls
    assert costs.estimate(512) >= costs.estimate(64)


def brute_levels(demand: dict, cost, factor: float) -> dict:
    light = min(demand.values())
    cap = max(factor * cost(light), cost(light * len(demand)))
    best = light
    for level in range(light, max(demand.values()) + 1):
        if cost(sum(min(d, level) for d in demand.values())) <= cap:
            best = level
    return {c: min(d, best) for c, d in demand.items()}


def test_water_fill_matches_a_brute_force_over_every_level():
    rng = random.Random(7)
    curves = [lambda n: 1.0 + n, lambda n: 10.0 + n * 0.1, lambda n: 5.0 + (n / 8) ** 2]
    for trial in range(300):
        cost = curves[trial % 3]
        demand = {f"c{i}": rng.randint(1, 600) for i in range(rng.randint(2, 5))}
        assert water_fill(demand, cost, 1.5) == brute_levels(demand, cost, 1.5), demand


def test_water_fill_leaves_one_client_and_an_unmeasured_machine_alone():
    assert water_fill({"a": 500}, lambda n: float(n)) is None
    assert water_fill({"a": 500, "b": 2}, lambda n: None) is None
    # where a step's cost barely grows with its tokens (a GPU), nobody is held back
    assert water_fill({"a": 500, "b": 2}, lambda n: 1.0 + n * 1e-4) == {"a": 500, "b": 2}


# ------------------------------------------------------------------ on the scheduler
def make(**cfg) -> Scheduler:
    config = ServerConfig(page_size=1, chunked_prefill_size=512, max_running_requests=4, **cfg)
    return Scheduler(config, FakeRunner(4000, 1, VOCAB, eos=None, max_rows=17))


class LinearCosts(StepCosts):
    """A machine where every token of a step costs the same (1 + n units): the fake runner's own
    times are microseconds of noise."""

    def record(self, tokens: int, seconds: float) -> None:
        pass

    def estimate(self, tokens: int) -> float:
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
    s = make()
    s.fair.costs = LinearCosts()
    outs: dict = {}
    for i in range(4):
        send(s, f"f{i}", "addr:flood", prompt_len=12, new=40)
    step_taking(s, outs)  # the flood alone: all four rows, whole prompts
    assert {r.rid for r in s.running} == {"f0", "f1", "f2", "f3"}
    send(s, "p0", "addr:polite", prompt_len=6, new=8)
    fed = step_taking(s, outs)
    # the rows were full: the flood's newest request gave its row back, and the polite prompt ran
    # (its 6 tokens: the level of the lightest client's demand, 6, fits the cap, cost(12))
    assert fed.get("p0") == 6 and "f3" not in fed, fed
    assert [r.rid for r in s.waiting] == ["f3"]
    polite_steps = 0
    while s.has_work():
        fed = step_taking(s, outs)
        if "p0" in fed:
            polite_steps += 1
            flood = sum(n for rid, n in fed.items() if rid != "p0")
            # cap = max(1.5 * cost(1), cost(2)) = 3 units: one flood token beside the polite one
            assert flood <= 1, fed
    assert polite_steps == 7  # p0 decoded in every step until its 8 tokens were out
    for rid in ["p0", "f0", "f3"]:
        alone = make()
        send(alone, rid, "addr:polite" if rid == "p0" else "addr:flood", 6 if rid == "p0" else 12,
             8 if rid == "p0" else 40)  # fmt: skip
        assert ids(outs, rid) == ids(drain(alone), rid), rid
    assert_all_pages_back(s)


def test_disable_fair_share_keeps_the_flood_in_every_row():
    s = make(disable_fair_share=True)
    s.fair.costs = LinearCosts()
    outs: dict = {}
    for i in range(4):
        send(s, f"f{i}", "addr:flood", new=40)
    step_taking(s, outs)
    send(s, "p0", "addr:polite", prompt_len=6)
    fed = step_taking(s, outs)
    assert "p0" not in fed and set(fed) == {"f0", "f1", "f2", "f3"}
    drain(s, outs)
    assert_all_pages_back(s)


def test_a_client_between_two_requests_still_counts(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(fair_share.time, "monotonic", lambda: now[0])
    s = make()
    s.fair.costs = LinearCosts()
    outs: dict = {}
    send(s, "p0", "addr:polite", prompt_len=4, new=1)
    send(s, "f0", "addr:flood", prompt_len=300, new=4)
    step_taking(s, outs)  # p0's prompt and its one token; f0 a share of its prompt
    now[0] += fair_share.RECENT_S / 2
    fed = step_taking(s, outs)  # p0 is done, but recent: f0 still gets a share, not 512 tokens
    assert 0 < fed["f0"] < 300, fed
    now[0] += fair_share.RECENT_S
    fed = step_taking(s, outs)  # p0's client is forgotten: the flood's prompt runs whole
    assert s.running[0].kv.computed_len == 300 or not s.running, fed
    drain(s, outs)
    assert_all_pages_back(s)


def test_a_beam_search_larger_than_its_share_saves_up_and_runs_whole():
    from types import SimpleNamespace

    from radixrt.runtime.core.fair_share import FairShare
    from radixrt.runtime.core.req import Req
    from radixrt.runtime.request.sampling_params import SamplingParams

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
