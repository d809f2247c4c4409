"""Samples of one prompt share its prefill (core/admission.py fork_donor): the first computes the prompt, the
others take its whole pages from the tree, copy its partial last page and compute only the last prompt token.

Truth: the fake runner (tests/fake_runner.py) checks before every forward that each request's prefix slots
hold exactly its own tokens, so a missing or wrong copy fails at once; outputs equal `reference_output`
(a pure function of the tokens); `check_integrity()` after every step, and every page back at the end.
Hypothesis mixes duplicated prompts, aborts mid-run and pools small enough to preempt.
"""

import random

import pytest
from fake_runner import reference_output
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler import (
    VOCAB,
    assert_all_pages_back,
    drain,
    drain_aborting,
    ids,
    make,
    submit,
)

from radixrt.runtime.core.admission import Admission
from radixrt.runtime.request.options import RequestOptions


@pytest.mark.parametrize("page_size", [4, 16])
def test_n_samples_prefill_the_prompt_once(page_size):
    prompt = [
        random.Random(1).randrange(1, VOCAB) for _ in range(103)
    ]  # 102 before the last: not whole pages
    tokens = {}
    for fork in (False, True):
        s = make(page_size, 4000, chunk=512, eos=None)
        s.admission = Admission(s.config, s.tree, s.memory, s.stats, s.sessions, fork_samples=fork)
        for i in range(8):
            submit(s, str(i), prompt, max_new_tokens=5)
        outs = drain(s)
        assert all(ids(outs, str(i)) == reference_output(prompt, 5, VOCAB, None) for i in range(8))
        tokens[fork] = s.runner.forward_tokens - 8 * 4  # minus the decode steps
        assert s.runner.num_page_copies == (7 if fork else 0)
        assert s.runner.num_copy_steps == (1 if fork else 0), (
            "the seven samples fork together, in one step"
        )
        assert_all_pages_back(s)
    partial = (len(prompt) - 1) % page_size
    assert tokens[True] == len(prompt) + 7, tokens
    assert tokens[False] == len(prompt) + 7 * (partial + 1), tokens


def test_no_fork_without_a_partial_page_or_with_prompt_logprobs():
    s = make(4, 4000, chunk=512, eos=None)
    prompt = list(range(1, 14))  # 12 = three whole pages before the last token: nothing to copy
    for i in range(3):
        submit(s, str(i), prompt, max_new_tokens=3)
    drain(s)
    assert s.runner.num_page_copies == 0
    s = make(4, 4000, chunk=512, eos=None)
    prompt = list(range(1, 16))
    for i in range(3):
        s.add_request(
            __import__("radixrt.runtime.messages", fromlist=["x"]).TokenizedGenerateReq(
                rid=str(i),
                input_ids=prompt,
                sampling_params={"max_new_tokens": 3},
                options=RequestOptions(return_logprob=True, logprob_start_len=0),
            )
        )
    drain(s)
    assert s.runner.num_page_copies == 0, "a request scoring its prompt computes it"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([2, 4, 8]),
    pool=st.sampled_from([160, 400, 2000]),
    num_abort=st.integers(0, 3),
)
def test_forked_samples_under_aborts_and_preemption(seed, page_size, pool, num_abort):
    rng = random.Random(seed)
    s = make(page_size, pool, chunk=rng.choice([16, 64]), eos=None, max_running=8)
    bases = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(5, 40))] for _ in range(3)]
    prompts = {}
    for i in range(12):
        prompts[str(i)] = rng.choice(bases)  # many duplicates: forks whenever a donor is running
        submit(s, str(i), prompts[str(i)], max_new_tokens=rng.randrange(1, 30))
    max_new = {r.rid: r.sampling.max_new_tokens for r in s.waiting}
    outs, aborted = drain_aborting(s, rng, prompts, num_abort, at_step=3)
    for rid, p in prompts.items():
        assert outs[rid][-1].finished_reason is not None, f"{rid} lost"
        if rid not in aborted and outs[rid][-1].finished_reason["type"] != "abort":
            assert ids(outs, rid) == reference_output(p, max_new[rid], VOCAB, None), rid
    assert_all_pages_back(s)
