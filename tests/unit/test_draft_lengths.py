"""#57: a step's speculative drafts cut to the total that pays (core/draft_lengths.py). Truth: a
brute force over every total of the expected tokens per second, and the rule's promise that the
chosen total's expected rate is never below no drafts."""

from __future__ import annotations

import random

from radixrt.runtime.core.draft_lengths import acceptance, cut_drafts, paying_total
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.step_costs import StepCosts
from radixrt.runtime.request.sampling_params import SamplingParams


def drafting(rid: str, draft: int, accepted: int = 0, missed: int = 0, verified: int = 1) -> Req:
    """A decoding request with a draft; `verified` draft steps so far (0: its first draft)."""
    r = Req(rid, [1, 2, 3], SamplingParams())
    r.output_ids, r.kv.computed_len = [4], 3
    r.draft_ids, r.draft_states = list(range(10, 10 + draft)), []
    r.spec_accepted, r.spec_missed, r.spec_verify_ct = accepted, missed, verified
    return r


def rate(worths: list[float], rows: int, total: int, cost) -> float:
    return (rows + sum(worths[:total])) / cost(rows + total, total > 0)


def test_the_paying_total_is_the_best_of_every_total_and_never_below_no_drafts():
    rng = random.Random(3)
    for _ in range(500):
        fixed, per_row, bend = rng.uniform(1, 20), rng.uniform(0, 3), rng.uniform(0, 0.05)

        def cost(n, verifies=False, fixed=fixed, per_row=per_row, bend=bend):
            return fixed + per_row * n + bend * n * n

        worths = sorted((rng.random() ** rng.randint(1, 4) for _ in range(rng.randint(1, 40))),
                        reverse=True)  # fmt: skip
        rows = rng.randint(1, 32)
        got = paying_total(worths, rows, cost)
        rates = [rate(worths, rows, e, cost) for e in range(len(worths) + 1)]
        assert rates[got] == max(rates) and got == rates.index(max(rates)), (got, rates)
        assert rates[got] >= rates[0]


def test_a_wide_batch_of_poor_guesses_verifies_none_and_a_good_guess_keeps_its_draft():
    def cost(n, verifies=False):  # a 2-core CPU's decode curve: each row costs
        return 0.012 + 0.002 * n

    poor = [drafting(f"p{i}", 4, accepted=1, missed=20) for i in range(16)]
    cut_drafts(poor, cost)
    assert all(r.draft_ids == [] for r in poor)  # 64 rows more for ~0.1 token each: no drafts
    good = drafting("g", 8, accepted=40, missed=5)  # the same answer asked again
    batch = [good, *[drafting(f"q{i}", 4, accepted=1, missed=20) for i in range(3)]]
    cut_drafts(batch, cost)
    assert len(good.draft_ids) >= 4 and all(r.draft_ids == [] for r in batch[1:])
    # the kept tokens are each request's first ones
    assert good.draft_ids == list(range(10, 10 + len(good.draft_ids)))


def test_where_rows_are_almost_free_every_guess_is_verified():
    def cost(n, verifies=False):  # one stream bound by reading the weights (a GPU, a large CPU)
        return 0.010 + 1e-6 * n

    batch = [drafting(f"r{i}", 5, accepted=8, missed=4) for i in range(8)]
    cut_drafts(batch, cost)
    assert all(len(r.draft_ids) == 5 for r in batch)


def test_grammar_drafts_stay_and_nothing_measured_keeps_every_draft():
    forced = drafting("f", 6, accepted=0, missed=50)
    forced.grammar = object()  # forced text: left alone whatever its record
    cut_drafts([forced], lambda n, v: 0.01 + 0.01 * n)
    assert len(forced.draft_ids) == 6
    fresh = drafting("n", 6)
    cut_drafts([fresh], lambda n, v: None)
    assert len(fresh.draft_ids) == 6
    assert acceptance(fresh) == 0.5  # the one-and-one prior


def test_a_first_draft_is_verified_whole_and_its_rows_count_against_the_others():
    def cost(n, verifies=False):
        return 0.012 + 0.002 * n

    first = drafting("first", 8, verified=0)  # nothing known of its guesses yet: tried
    other = drafting("o", 4, accepted=6, missed=3)
    cut_drafts([first, other], cost)
    assert len(first.draft_ids) == 8
    alone = drafting("o2", 4, accepted=6, missed=3)
    cut_drafts([alone, drafting("d", 0)], cost)
    # beside the first draft's 8 rows a guess adds less to the step's tokens than alone, for the
    # same cost: the other keeps fewer (p = 7/11; 1 of 4 against 2 of 4 on this curve)
    assert len(other.draft_ids) < len(alone.draft_ids)


def test_row_counts_past_the_measured_ones_cost_the_largest_so_drafts_run_and_are_learnt():
    costs = StepCosts()
    for _ in range(5):
        costs.record(1, 0.010)  # only single rows measured, no verify step yet
    assert costs.draft_cost(5, True) == costs.draft_cost(1, False) == 0.010
    lone = drafting("l", 4)  # (verified once: p = 0.5)
    cut_drafts([lone], costs.draft_cost)
    assert len(lone.draft_ids) == 4  # tried, and so measured
    for _ in range(5):
        costs.record(5, 0.050, verifies=True)  # a verify step of 5 costs five one-row steps
    assert costs.draft_cost(1, False) == 0.010  # the decode curve keeps its own points
    again = drafting("a", 4)
    cut_drafts([again], costs.draft_cost)
    assert again.draft_ids == []  # at p = 0.5 they do not pay


def test_a_verify_step_is_costed_on_its_own_curve_not_by_its_token_count():
    costs = StepCosts()
    for _ in range(5):
        costs.record(16, 0.040)  # 16 plain decode rows: the whole-step graph
        costs.record(24, 0.045)  # 24 plain rows
        costs.record(17, 0.080, verifies=True)  # 16 rows + a draft token: off the graph
    good = [drafting(f"g{i}", 1, accepted=6, missed=3) for i in range(16)]  # p = 7/11
    worths = [7 / 11] * 16
    # by token count alone 16 more tokens cost 5 ms for ~10 expected: every draft would be kept
    assert paying_total(worths, 16, lambda n, v: costs.draft_cost(n, False)) == 16
    cut_drafts(good, costs.draft_cost)
    # as verify steps cost: 26 expected tokens in 80 ms against 16 in 40: none pays
    assert all(r.draft_ids == [] for r in good)


def test_in_a_wide_step_first_drafts_are_judged_by_the_prior_not_all_verified():
    def cost(n, verifies=False):  # each row costs 3% of a 16-row step
        return 0.012 + 0.001 * n

    fresh = [drafting(f"f{i}", 4, verified=0) for i in range(16)]  # nothing known of any of them
    cut_drafts(fresh, cost)
    kept = sum(len(r.draft_ids) for r in fresh)
    assert kept < 16  # not 64 rows at once: at p = 0.5 only the first tokens that pay, if any
    worths = sorted((0.5**j for _ in range(16) for j in range(1, 5)), reverse=True)
    rates = [rate(worths, 16, e, cost) for e in range(len(worths) + 1)]  # every total, by hand
    assert kept == rates.index(max(rates))
