"""One request's failure stays that request's: faults injected into each scheduler stage for a chosen
request (core/faults.py) on the fake runner. The culprit ends with an error; every other request's output
still equals the pure-function reference; no page, row or lock leaks; the scheduler keeps serving.
A failure that cannot be pinned on one request (the forward) fails that step's requests and the loop
goes on."""

import random
import zlib

import pytest
from fake_runner import FakeRunner, reference_output

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.faults import FaultInjector
from radixrt.runtime.core.plan import PlanItemError
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq

VOCAB = 50
MARK = 49  # the token that marks the culprit's prompt; innocent prompts never contain it


def make(faults: str, page_size: int = 1, num_tokens: int = 600) -> Scheduler:
    cfg = ServerConfig(page_size=page_size, chunked_prefill_size=32, max_running_requests=8)
    s = Scheduler(
        cfg,
        FakeRunner(
            num_pages=num_tokens // page_size,
            page_size=page_size,
            vocab_size=VOCAB,
            eos=0,
            max_rows=9,
        ),
    )
    s.faults = FaultInjector(faults)
    return s


def run(s: Scheduler, prompts: dict[str, list[int]], max_new: int = 12) -> dict[str, list]:
    outs: dict[str, list] = {}
    for rid, p in prompts.items():
        s.add_request(
            TokenizedGenerateReq(rid=rid, input_ids=p, sampling_params={"max_new_tokens": max_new})
        )
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
    for _ in range(2000):
        if not s.has_work():
            break
        s.step()
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
        s.check_integrity()
    assert not s.has_work(), "the scheduler did not finish"
    return outs


def prompts_with_culprit(rng: random.Random, culprit: bool = True) -> dict[str, list[int]]:
    shared = [rng.randrange(1, MARK) for _ in range(40)]
    out = {
        f"ok{i}": shared + [rng.randrange(1, MARK) for _ in range(rng.randrange(1, 30))]
        for i in range(5)
    }
    while culprit:  # a culprit that decodes: one ending on its first token never reaches `plan`
        bad = shared + [rng.randrange(1, MARK) for _ in range(7)] + [MARK] + [3, 4]
        if len(reference_output(bad, 12, VOCAB, 0)) > 2:
            out["bad"] = bad
            break
    return out


def check(s: Scheduler, outs: dict, prompts: dict, failed: set[str], max_new: int = 12) -> None:
    for rid, p in prompts.items():
        last = outs[rid][-1]
        assert last.finished_reason is not None, rid
        if rid in failed:
            assert last.finished_reason["type"] == "abort" and "injected fault" in last.error, (
                rid,
                last,
            )
        else:
            assert last.error is None, (rid, last.error)
            got = [t for o in outs[rid] for t in o.new_ids]
            assert got == reference_output(p, max_new, VOCAB, 0), rid
    s.check_integrity()
    assert s.admin.flush_cache() and s.memory.allocator.num_free == s.memory.allocator.num_pages, (
        "pages leaked"
    )
    assert s.memory.rows.num_free == s.memory.rows.num_rows, "table rows leaked"


@pytest.mark.parametrize("stage", ["intake", "plan", "sample", "apply"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_fault_pinned_on_one_request_fails_it_alone(stage, page_size):
    s = make(f"{stage}:{MARK}", page_size)
    # seeded by the case's name: str hashes differ between processes
    prompts = prompts_with_culprit(random.Random(zlib.crc32(f"{stage}/{page_size}".encode())))
    outs = run(s, prompts)
    check(s, outs, prompts, {"bad"})
    # and the scheduler keeps serving
    again = prompts_with_culprit(random.Random(7), culprit=False)
    check(s, run(s, again), again, set())


def test_a_forward_fault_fails_its_step_and_the_loop_recovers():
    s = make(f"forward:{MARK}")
    rng = random.Random(3)
    prompts = prompts_with_culprit(rng)
    outs = run(s, prompts)
    failed = {rid for rid, o in outs.items() if o[-1].finished_reason["type"] == "abort"}
    assert "bad" in failed  # every step carrying it failed, with whoever shared that step
    assert s.stats.num_step_failures >= 1
    check(s, outs, prompts, failed)
    again = prompts_with_culprit(random.Random(8), culprit=False)
    check(s, run(s, again), again, set())


def test_an_injected_fault_in_every_stage_at_once_never_stops_the_scheduler():
    s = make(
        ",".join(
            f"{st}:{MARK}" for st in ("intake", "grammar", "plan", "forward", "sample", "apply")
        )
    )
    prompts = prompts_with_culprit(random.Random(11))
    outs = run(s, prompts)
    assert outs["bad"][-1].finished_reason["type"] == "abort"
    again = prompts_with_culprit(random.Random(12), culprit=False)
    check(s, run(s, again), again, set())


def test_runner_plan_item_error_fails_only_those_items():
    """A runner that cannot sample one item's row (PlanItemError) fails that request; the step's
    other requests run the step again and still match the reference."""
    s = make("")
    real_run = s.runner.run
    state = {"armed": True}

    def flaky(plan, mask_sources):
        results = real_run(plan, mask_sources)
        for i, it in enumerate(plan):
            if state["armed"] and MARK in it.prompt_ids and it.picks:
                state["armed"] = False
                raise PlanItemError([i], "no token is allowed (test)")
        return results

    s.runner.run = flaky
    prompts = prompts_with_culprit(random.Random(5))
    outs = run(s, prompts)
    assert (
        outs["bad"][-1].finished_reason["type"] == "abort"
        and "no token is allowed" in outs["bad"][-1].error
    )
    for rid, p in prompts.items():
        if rid != "bad":
            assert [t for o in outs[rid] for t in o.new_ids] == reference_output(p, 12, VOCAB, 0), (
                rid
            )
    s.check_integrity()


def test_fault_spec_is_validated():
    with pytest.raises(ValueError, match="stage:token_id"):
        FaultInjector("nonsense:1")
    with pytest.raises(ValueError):
        FaultInjector("sample:x")
    assert FaultInjector("").markers == {}
