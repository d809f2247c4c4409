"""Beam search: the search against transformers' own beam search, and the scheduler's beams against
the search.

1. core/beam_search.py is driven by a table "model" (logits a pure function of the token sequence)
   and compared with `transformers`' generate(num_beams=...) on the very same model: returned
   sequences and their length-penalised scores, over widths, length penalties, every early_stopping
   value, one or two EOS ids and EOS inside the budget.
2. The scheduler runs beams as requests sharing pages (core/beam_group.py) over the fake runner,
   whose KV check fails at once when a beam's prefix slots hold anything but its own tokens (a
   missing page copy, a page shared wrongly); the returned beams must equal the search run directly
   on the fake runner's offers, through preemption (small pools), aborts, page sizes, ordinary
   requests in the same batches, and every page must come back.
"""

from __future__ import annotations

import hashlib
import random

import pytest
import torch
from fake_runner import beam_offers, reference_output
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
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from radixrt.runtime.core.beam_search import BeamSearch
from radixrt.runtime.request.options import RequestOptions

# ------------------------------------------------------------------ the search vs transformers


class TableConfig(PretrainedConfig):
    model_type = "radixrt_table_lm"

    def __init__(self, vocab_size: int = 12, seed: int = 0, sharpness: float = 2.0, **kw):
        super().__init__(**kw)
        self.vocab_size, self.seed, self.sharpness = vocab_size, seed, sharpness


def table_logits(seq: list[int], cfg: TableConfig) -> torch.Tensor:
    digest = hashlib.sha256(repr((cfg.seed, tuple(seq))).encode()).hexdigest()
    gen = torch.Generator().manual_seed(int(digest[:8], 16))
    return torch.randn(cfg.vocab_size, generator=gen) * cfg.sharpness


class TableLM(PreTrainedModel, GenerationMixin):
    """Logits of the last position only (all generate reads), from table_logits."""

    config_class = TableConfig

    def __init__(self, config: TableConfig):
        super().__init__(config)
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.config.vocab_size)
        for b in range(batch):
            logits[b, -1] = table_logits(input_ids[b].tolist(), self.config)
        return CausalLMOutput(logits=logits)


def run_search(offer, width, max_new, eos, length_penalty, early_stopping, num_return):
    """BeamSearch driven to its end; offer(output_ids, n): a beam's best n (logprob, token)."""
    search = BeamSearch(
        width,
        max_new_tokens=max_new,
        stop_ids=frozenset(eos),
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    beams = [([], 0.0)]
    while not search.done:
        offers = [offer(out, search.num_candidates) for out, _ in beams]
        chosen = search.step([o for o, _ in beams], [t for _, t in beams], offers)
        beams = [(beams[c.parent][0] + [c.token], c.total) for c in chosen]
    return search.results(num_return)


def search_on_table(cfg, prompt, width, max_new, eos, length_penalty, early_stopping, num_return):
    def offer(out, n):
        vals, toks = torch.log_softmax(table_logits(prompt + out, cfg), dim=-1).topk(n)
        return list(zip(vals.tolist(), toks.tolist()))

    return run_search(offer, width, max_new, eos, length_penalty, early_stopping, num_return)


CASES = [
    # width, max_new, eos ids, length_penalty, early_stopping, sharpness
    (2, 6, [0], 1.0, False, 2.0),
    (3, 8, [0], 1.0, True, 1.0),
    (4, 7, [0], 0.0, "never", 1.5),
    (4, 9, [0, 1], 2.0, False, 1.2),
    (5, 5, [0], -0.5, "never", 2.5),
    (3, 10, [0, 1], 1.0, "never", 0.8),
    (2, 1, [0], 1.0, False, 2.0),
    (6, 6, [0], 0.7, True, 1.0),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_the_search_equals_transformers_beam_search(case, seed):
    width, max_new, eos, length_penalty, early_stopping, sharpness = case
    cfg = TableConfig(vocab_size=12, seed=seed, sharpness=sharpness)
    pad = 11
    model = TableLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    prompt = random.Random(seed).choices(range(2, 11), k=1 + seed % 4)
    hf = model.generate(
        torch.tensor([prompt]),
        num_beams=width,
        num_return_sequences=width,
        do_sample=False,
        max_new_tokens=max_new,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        use_cache=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    ours = search_on_table(cfg, prompt, width, max_new, eos, length_penalty, early_stopping, width)
    assert len(ours) == width
    for hyp, row, score in zip(ours, hf.sequences[:, len(prompt) :].tolist(), hf.sequences_scores):
        n = len(hyp.output_ids)
        assert list(hyp.output_ids) == row[:n] and all(t == pad for t in row[n:]), (ours, row)
        assert hyp.score == pytest.approx(float(score), rel=1e-6, abs=1e-7)
    assert [h.score for h in ours] == sorted((h.score for h in ours), reverse=True)
    some_end_on_eos = any(h.output_ids[-1] in eos for h in ours)
    assert some_end_on_eos or all(len(h.output_ids) == max_new for h in ours)


def test_eos_inside_the_budget_is_exercised():
    """The cases above include beams that end on EOS before max_new_tokens (else EOS handling would
    go untested)."""
    early = 0
    for case in CASES:
        width, max_new, eos, lp, es, sharp = case
        for seed in range(4):
            cfg = TableConfig(vocab_size=12, seed=seed, sharpness=sharp)
            prompt = random.Random(seed).choices(range(2, 11), k=1 + seed % 4)
            hyps = search_on_table(cfg, prompt, width, max_new, eos, lp, es, width)
            early += sum(len(h.output_ids) < max_new for h in hyps)
    assert early >= 10


# ------------------------------------------------------------------ beams in the scheduler


def reference_beams(prompt, width, max_new, num_return, eos=(0,)):
    """The search run directly on the fake runner's offers: what the scheduler's beams must give."""
    hyps = run_search(
        lambda out, n: beam_offers(prompt + out, VOCAB, n),
        width,
        max_new,
        eos,
        1.0,
        False,
        num_return,
    )
    return [list(h.output_ids) for h in hyps]


def beam_ids(outs, rid):
    (last,) = [o for o in outs[rid] if o.finished_reason is not None]
    return [b["output_ids"] for b in last.beams]


@pytest.mark.parametrize("page_size", [1, 4])
def test_beams_equal_the_search_and_share_their_pages(page_size):
    s = make(page_size, 4000, chunk=64, max_running=16)
    prompt = [random.Random(3).randrange(1, VOCAB) for _ in range(23)]
    submit(s, "b", prompt, beam_width=4, max_new_tokens=20)
    outs = drain(s)
    assert beam_ids(outs, "b") == reference_beams(prompt, 4, 20, 4)
    (last,) = outs["b"]
    one_sequence = -(-(len(prompt) + 20) // page_size)
    peak = last.beams[0]["peak_pages"]
    assert one_sequence < peak < 4 * one_sequence * 0.6, (peak, one_sequence)
    assert s.runner.num_page_copies > 0 if page_size > 1 else s.runner.num_page_copies == 0
    assert [b["score"] for b in last.beams] == sorted(
        (b["score"] for b in last.beams), reverse=True
    )
    assert_all_pages_back(s)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([1, 2, 4]),
    pool=st.sampled_from([200, 500, 3000]),
    num_abort=st.integers(0, 2),
)
def test_beams_and_ordinary_requests_under_preemption_and_aborts(seed, page_size, pool, num_abort):
    rng = random.Random(seed)
    s = make(page_size, pool, chunk=rng.choice([16, 64]), max_running=12)
    expected = {}
    for i in range(6):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 30))]
        max_new = rng.randrange(1, 14)
        if i % 2:
            width, num_return = rng.choice([2, 3, 4]), rng.randrange(1, 3)
            submit(s, str(i), prompt, beam_width=width, n=num_return, max_new_tokens=max_new)
            expected[str(i)] = ("beams", reference_beams(prompt, width, max_new, num_return))
        else:
            submit(s, str(i), prompt, max_new_tokens=max_new)
            expected[str(i)] = ("ids", reference_output(prompt, max_new, VOCAB, 0))
    outs, aborted = drain_aborting(s, rng, expected, num_abort, at_step=4)
    for rid, (kind, want) in expected.items():
        reason = outs[rid][-1].finished_reason
        assert reason is not None, f"{rid} lost"
        if rid in aborted and reason["type"] == "abort":
            continue
        got = beam_ids(outs, rid) if kind == "beams" else ids(outs, rid)
        assert got == want, rid
    assert not s.beams.groups
    assert_all_pages_back(s)


def test_a_preempted_beam_search_starts_again_and_ends_the_same():
    prompt = list(range(1, 30))
    s = make(4, 120, chunk=64, max_running=12, eos=None)
    submit(s, "x", list(range(5, 40)), max_new_tokens=40)
    submit(s, "b", prompt, beam_width=4, max_new_tokens=16)
    outs = drain(s)
    assert s.stats.num_preemptions > 0 and s.beams.groups == {}
    assert beam_ids(outs, "b") == reference_beams(prompt, 4, 16, 4, eos=())
    assert ids(outs, "x") == reference_output(list(range(5, 40)), 40, VOCAB, None)
    assert_all_pages_back(s)


def test_a_fork_without_pages_restarts_the_group(monkeypatch):
    """A fork that finds no pages (the pool ran dry mid-advance) drops every beam, forked ones
    included, and the search runs again to the same result."""
    s = make(4, 2000, chunk=64)
    real_fork, calls = s.memory.fork_beam, []

    def failing_once(child, parent):
        calls.append(child.rid)
        if len(calls) == 3:
            s.memory.drop(child)
            return False
        return real_fork(child, parent)

    monkeypatch.setattr(s.memory, "fork_beam", failing_once)
    prompt = list(range(1, 26))
    submit(s, "b", prompt, beam_width=4, max_new_tokens=12)
    outs = drain(s)
    assert s.stats.num_preemptions == 1
    assert beam_ids(outs, "b") == reference_beams(prompt, 4, 12, 4)
    assert_all_pages_back(s)


def test_an_abort_ends_every_beam_and_frees_their_pages():
    s = make(2, 2000, chunk=64)
    submit(s, "b", list(range(1, 20)), beam_width=6, max_new_tokens=30)
    for _ in range(6):
        s.step()
    assert len([r for r in s.running if r.beam is not None]) == 6
    s.abort("b")
    (out,) = s.take_outputs()
    assert out.finished_reason["type"] == "abort" and out.error is None and not out.new_ids
    assert not s.running and not s.beams.groups
    assert_all_pages_back(s)


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"beam_width": 4, "stream": True}, "stream"),
        ({"beam_width": 4, "n": 5}, "n"),
        ({"beam_width": 17}, "beam_width"),
        ({"beam_width": 4, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"beam_width": 4, "stop": ["x"]}, "stop"),
        ({"beam_width": 4, "early_stopping": "sometimes"}, "early_stopping"),
        ({"beam_width": 4, "length_penalty": float("nan")}, "length_penalty"),
        ({"beam_width": 4, "max_new_tokens": 300}, "KV pool"),
        ({"beam_width": 14}, "max-running-requests"),
    ],
)
def test_bad_beam_requests_are_refused_naming_the_problem(params, needle):
    from radixrt.runtime.messages import TokenizedGenerateReq

    s = make(1, 1000, max_running=12)
    stream = params.pop("stream", False)
    params.setdefault("max_new_tokens", 8)
    s.add_request(
        TokenizedGenerateReq(
            rid="r",
            input_ids=[1, 2, 3],
            sampling_params=params,
            options=RequestOptions(stream=stream),
        )
    )
    (out,) = s.take_outputs()
    assert out.finished_reason["type"] == "abort" and out.error_status == 400
    assert needle in out.error, out.error
    assert not s.waiting and not s.beams.groups


@pytest.mark.parametrize("culprits", [None, "two beams"])
def test_a_failed_step_ends_the_beam_search_once_and_the_rest_run_on(culprits):
    """A forward failing while a beam search decodes fails the whole search once (every beam was a
    culprit: a step that cannot tell, or a PlanItemError naming two beams), frees every page, and
    the ordinary request beside it finishes with its reference output."""
    from radixrt.runtime.core.plan import PlanItemError

    s = make(2, 2000, chunk=64)
    submit(s, "b", list(range(1, 20)), beam_width=4, max_new_tokens=30)
    submit(s, "plain", [3, 4, 5], max_new_tokens=8, ignore_eos=True)
    for _ in range(6):
        s.step()
    beams = [i for i, r in enumerate(s.running) if r.beam is not None]
    assert len(beams) == 4
    run, calls = s.runner.run, []

    def failing(items, masks):
        calls.append(1)
        if len(calls) == 1:
            if culprits is None:
                raise RuntimeError("the forward failed")
            rows = [
                i
                for i, it in enumerate(items)
                if it.row in {s.running[b].kv.table_row for b in beams}
            ]
            raise PlanItemError(rows[:2], "two beams at fault")
        return run(items, masks)

    s.runner.run = failing
    outs = drain(s)
    (end,) = outs["b"]
    assert end.finished_reason["type"] == "abort" and end.error_status == 500
    if culprits is None:  # the step could not tell: its every request failed
        assert outs["plain"][-1].finished_reason["type"] == "abort"
    else:
        assert ids(outs, "plain") == reference_output([3, 4, 5], 8, VOCAB, None)
    assert not s.beams.groups
    assert_all_pages_back(s)


def test_a_beam_whose_decode_cannot_be_planned_takes_its_search_out_of_the_step():
    """Planning one beam's decode fails: its search ends, and its siblings' items already planned
    leave the step (their pages and rows are free again: nothing may run on them)."""
    s = make(2, 2000, chunk=64)
    submit(s, "b", list(range(1, 20)), beam_width=4, max_new_tokens=30)
    submit(s, "plain", [3, 4, 5], max_new_tokens=8, ignore_eos=True)
    for _ in range(6):
        s.step()
    decode, planned = s.items.decode, []

    def failing(req, budget, masks):
        planned.append(req)
        if req.beam is not None and sum(r.beam is not None for r in planned) == 3:
            raise RuntimeError("a grammar state broke")
        return decode(req, budget, masks)

    beam_rows = {r.kv.table_row for r in s.running if r.beam is not None}
    run, rows_run = s.runner.run, []

    def recording(items, masks):
        rows_run.extend(it.row for it in items)
        return run(items, masks)

    s.items.decode, s.runner.run = failing, recording
    s.step()
    s.items.decode, s.runner.run = decode, run
    assert rows_run and not beam_rows & set(rows_run), "a dead beam's item ran"
    outs = drain(s)
    (end,) = outs["b"]
    assert end.finished_reason["type"] == "abort" and end.error_status == 500
    assert ids(outs, "plain") == reference_output([3, 4, 5], 8, VOCAB, None)
    assert not s.beams.groups
    assert_all_pages_back(s)
