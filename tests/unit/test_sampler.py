"""Sampler against independent truths: numpy argmax / distributions / penalties / log_softmax."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from radixrt.runtime.core.plan import SampleRow
from radixrt.runtime.model import sampler
from radixrt.runtime.model.sampler import apply_penalties, sample, truncated_probs
from radixrt.runtime.request.sampling_params import SamplingParams


def row(output_ids=(), prompt_ids=(), **kw) -> SampleRow:
    extra = {k: kw.pop(k) for k in ("return_logprob", "top_logprobs_num", "blocked_ids") if k in kw}
    return SampleRow(
        params=SamplingParams(**kw),
        output_ids=list(output_ids),
        prompt_ids=list(prompt_ids),
        **extra,
    )


def rand_logits(num_rows: int, vocab_size: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.from_numpy(
        np.random.default_rng(seed).normal(0, scale, (num_rows, vocab_size)).astype(np.float32)
    )


# ---------------------------------------------------------------- numpy truth


def np_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def np_expected(logits: np.ndarray, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0) -> np.ndarray:
    """HF warper chain: temperature, top-k, top-p (on the top-k renormalised dist), min-p."""
    p = np_softmax(logits.astype(np.float64) / temperature)
    order = np.argsort(-p)
    if top_k > 0:
        p[order[top_k:]] = 0.0
        p /= p.sum()
    if top_p < 1.0:
        mass_before = np.cumsum(p[order]) - p[order]
        p[order[mass_before >= top_p]] = 0.0
        p /= p.sum()
    if min_p > 0.0:
        p[p < min_p * p.max()] = 0.0
        p /= p.sum()
    return p


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Pearson chi-square p-value (Wilson-Hilferty approximation). Tokens with expected mass 0
    must never be drawn; bins expecting < 5 are pooled."""
    assert counts[expected_p == 0].sum() == 0, (
        f"drew excluded tokens: {np.nonzero(counts * (expected_p == 0))}"
    )
    n = counts.sum()
    exp = expected_p * n
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    if (~big & (expected_p > 0)).any():
        obs_b.append(counts[~big].sum())
        exp_b.append(exp[~big].sum())
    obs_b, exp_b = np.array(obs_b, float), np.array(exp_b, float)
    dof = len(obs_b) - 1
    if dof == 0:
        return 1.0
    x = ((obs_b - exp_b) ** 2 / exp_b).sum()
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def np_penalised(logits: np.ndarray, r: SampleRow) -> np.ndarray:
    out = logits.astype(np.float64).copy()
    rp = r.params.repetition_penalty
    for t in set(r.prompt_ids) | set(r.output_ids):
        out[t] = out[t] / rp if out[t] > 0 else out[t] * rp
    for t, c in Counter(r.output_ids).items():
        out[t] -= r.params.frequency_penalty * c + r.params.presence_penalty
    return out


def np_log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


# ---------------------------------------------------------------- greedy, fast path, masks


def test_greedy_is_argmax_and_top_k_one_is_greedy():
    logits = rand_logits(9, 300, 0)
    rows = [row(temperature=0.0) for _ in range(5)] + [
        row(temperature=1.7, top_k=1) for _ in range(3)
    ]
    rows.append(row(temperature=0.5, top_k=1, seed=7, top_p=0.3))
    torch.manual_seed(0)
    assert sample(logits, rows).next_ids == list(np.argmax(logits.numpy(), axis=1))


class OpLog(TorchFunctionMode):
    """Records every torch call made (tensor metadata reads aside)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in ("dim", "__get__", "size", "is_contiguous"):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def test_all_greedy_batch_is_one_max_call():
    logits = rand_logits(64, 500, 1)
    logits[5, [7, 300]] = logits[5].max() + 1  # a tie: the first index wins, as with argmax
    rows = [row(temperature=0.0, seed=i, stop_token_ids=[2]) for i in range(64)]
    with OpLog() as log:
        ids = sample(logits, rows).next_ids
    assert log.ops == ["max", "tolist"], log.ops
    assert ids == list(np.argmax(logits.numpy(), axis=1)) and ids[5] == 7


def test_masked_and_blocked_ids_never_chosen():
    num_rows, vocab_size = 240, 40
    logits = rand_logits(num_rows, vocab_size, 2, scale=3.0)
    rng = np.random.default_rng(3)
    allowed = rng.random((num_rows, vocab_size)) < 0.3
    allowed[np.arange(num_rows), rng.integers(0, vocab_size, num_rows)] = True
    kinds = [
        dict(temperature=0.0),
        dict(temperature=1.0),
        dict(temperature=2.0, top_p=0.9),
        dict(top_k=5),
        dict(min_p=0.05, seed=11),
        dict(temperature=0.0, repetition_penalty=1.5),
    ]
    rows = []
    for i in range(num_rows):
        ok = np.nonzero(allowed[i])[0]
        block = (
            list(rng.choice(ok, size=len(ok) - 1, replace=False))
            if i % 3 == 0 and len(ok) > 1
            else None
        )
        rows.append(
            row(output_ids=[int(t) for t in ok[:2]], blocked_ids=block, **kinds[i % len(kinds)])
        )
    before = logits.clone()
    for trial in range(5):
        torch.manual_seed(trial)
        ids = sample(logits, rows, torch.from_numpy(allowed)).next_ids
        for i, (t, r) in enumerate(zip(ids, rows)):
            assert allowed[i, t] and t not in (r.blocked_ids or []), (i, t)
    assert torch.equal(logits, before), "sample must not modify its input"
    # greedy rows pick the argmax over what is left (rows with penalties: over the penalised logits)
    for i, r in enumerate(rows):
        if r.params.is_greedy:
            z = np.where(allowed[i], np_penalised(logits[i].numpy(), r), -np.inf)
            z[list(r.blocked_ids or [])] = -np.inf
            assert ids[i] == int(np.argmax(z))
        if r.blocked_ids:  # exactly one id is left
            assert ids[i] == next(t for t in np.nonzero(allowed[i])[0] if t not in r.blocked_ids)


def test_row_without_allowed_token_is_a_bug():
    logits = rand_logits(3, 20, 4)
    allowed = torch.ones(3, 20, dtype=torch.bool)
    allowed[1] = False
    with pytest.raises(AssertionError, match=r"rows \[1\]"):
        sample(logits, [row(), row(), row(temperature=0.0)], allowed)
    allowed[1, 5] = True
    with pytest.raises(AssertionError, match=r"rows \[1\]"):
        sample(logits, [row(), row(temperature=0.0, blocked_ids=[5]), row()], allowed)
    with pytest.raises(AssertionError):
        sample(logits, [row(), row()])


# ---------------------------------------------------------------- distributions


@pytest.fixture(params=["inverse_cdf", "race"])
def draw(request, monkeypatch):
    """Both draws: inverse CDF (the CPU default) and the exponential race (the GPU default)."""
    monkeypatch.setattr(sampler, "use_race", lambda device: request.param == "race")
    return request.param


def draw_counts(
    logits_row: torch.Tensor, configs: list[dict], num_draws: int, torch_seed: int
) -> list[np.ndarray]:
    """num_draws draws per config, all configs interleaved in ONE batched call (per-row params)."""
    # rows are read-only: share them
    shared = [SampleRow(params=SamplingParams(**c), output_ids=[], prompt_ids=[]) for c in configs]
    rows = shared * num_draws
    torch.manual_seed(torch_seed)
    ids = np.array(sample(logits_row.expand(len(rows), -1), rows).next_ids)
    vocab_size = logits_row.shape[0]
    return [np.bincount(ids[c :: len(configs)], minlength=vocab_size) for c in range(len(configs))]


SORT_PATH = [
    dict(temperature=0.7),
    dict(top_k=5),
    dict(top_p=0.8),
    dict(min_p=0.1, temperature=1.3),
    dict(temperature=1.3, top_k=8, top_p=0.9, min_p=0.05),
]
TOPK_PATH = [dict(top_k=6), dict(top_k=9, top_p=0.7, temperature=0.8), dict(top_k=3, min_p=0.3)]
UNSORTED_PATH = [dict(temperature=0.6), dict(min_p=0.2), dict(temperature=1.5, min_p=0.1)]


@pytest.mark.parametrize(
    "configs", [SORT_PATH, TOPK_PATH, UNSORTED_PATH], ids=["sort", "topk", "unsorted"]
)
def test_empirical_frequencies_match_numpy(configs, draw):
    logits = rand_logits(1, 16, 5, scale=1.2)[0]
    for cfg, counts in zip(configs, draw_counts(logits, configs, 6000, torch_seed=6)):
        expected = np_expected(logits.numpy(), **cfg)
        assert chi2_pvalue(counts, expected) > 1e-4, (
            cfg,
            counts,
            np.round(expected * counts.sum()),
        )
        # the truncation is visible: the test can fail
        if any(k in cfg for k in ("top_k", "top_p", "min_p")):
            assert (
                chi2_pvalue(counts, np_expected(logits.numpy(), cfg.get("temperature", 1.0))) < 1e-6
            ), cfg


def test_draw_across_chunk_edges_and_masks(draw):
    """Mass on tokens at the edges of the inverse CDF's 256-token chunks, in the padded last chunk,
    next to masked tokens; a 0.002-mass tail spread over the rest."""
    vocab_size, num_draws = 600, 10000
    hot = [0, 1, 254, 255, 256, 257, 400, 511, 512, 513, 597, 598, 599]
    logits = torch.full((vocab_size,), -9.0)
    logits[hot] = torch.from_numpy(
        np.random.default_rng(17).normal(0, 1, len(hot)).astype(np.float32)
    )
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[[1, 256, 400, 598, 3, 300]] = False
    torch.manual_seed(18)
    ids = sample(
        logits.expand(num_draws, -1), [row()] * num_draws, allowed.expand(num_draws, -1)
    ).next_ids
    counts = np.bincount(ids, minlength=vocab_size)
    expected = np_softmax(np.where(allowed.numpy(), logits.numpy().astype(np.float64), -np.inf))
    assert chi2_pvalue(counts, expected) > 1e-4, counts[hot]
    tail = np.setdiff1d(np.arange(vocab_size), hot)
    assert abs(counts[tail].sum() - expected[tail].sum() * num_draws) < 5 * math.sqrt(
        expected[tail].sum() * num_draws
    )


def test_chi2_rejects_a_wrong_temperature(draw):
    logits = rand_logits(1, 16, 5, scale=1.2)[0]
    [counts] = draw_counts(logits, [dict(temperature=0.7)], 6000, torch_seed=7)
    assert chi2_pvalue(counts, np_expected(logits.numpy(), temperature=0.85)) < 1e-6


def test_truncation_matches_numpy_on_a_large_vocabulary(monkeypatch):
    """The kept set and weights, exactly, for V = 8192: on the CPU a top_p row without top_k is
    cut from 1024 candidates when its nucleus closes inside them, else from a full sort."""
    widths = []
    real = sampler._sorted_prefix
    monkeypatch.setattr(
        sampler, "_sorted_prefix", lambda *a: widths.append(real(*a).shape[1]) or real(*a)
    )
    vocab_size = 8192
    configs = [
        dict(top_p=0.9),
        dict(top_p=0.6, temperature=0.5),
        dict(top_k=40, top_p=0.8),
        dict(top_k=900, min_p=0.002),
        dict(min_p=0.05, temperature=0.8),
        dict(temperature=1.1),
    ]
    for scale, want_widths in (
        (6.0, [1024]),
        (0.5, [vocab_size]),
    ):  # peaked: nucleus fits; flat: it doesn't
        widths.clear()
        logits = rand_logits(len(configs), vocab_size, 16, scale=scale)
        got = truncated_probs(logits, [row(**c) for c in configs]).numpy()
        assert widths == want_widths
        for i, cfg in enumerate(configs):
            want = np_expected(logits[i].numpy(), **cfg)
            np.testing.assert_array_equal(got[i] > 0, want > 0, err_msg=str(cfg))
            np.testing.assert_allclose(
                got[i] / got[i].sum(), want, rtol=1e-4, atol=1e-8, err_msg=str(cfg)
            )
            if cfg != dict(temperature=1.1):
                assert 0 < (want > 0).sum() < vocab_size, cfg  # something was cut


# ---------------------------------------------------------------- seeds

SEEDED = [
    dict(seed=1234, temperature=0.9, top_p=0.95),  # full sort
    dict(seed=99, temperature=1.2, top_k=50, min_p=0.01),  # topk path when alone
    dict(seed=2**62 + 5, min_p=0.02),
]  # unsorted path when alone
OTHERS = [
    dict(),
    dict(temperature=0.0),
    dict(top_k=200),
    dict(top_k=7, top_p=0.5),
    dict(top_p=0.9, seed=5),
    dict(temperature=0.3, frequency_penalty=1.0),
]


def test_seeded_row_is_independent_of_batch_and_global_rng(draw):
    vocab_size = 1000
    logits = rand_logits(1, vocab_size, 8, scale=0.7)
    rng = np.random.default_rng(9)
    for cfg in SEEDED:
        target = row(output_ids=[3, 4, 5, 6], prompt_ids=[1, 2], **cfg)
        torch.manual_seed(0)
        alone = sample(logits, [target]).next_ids[0]
        for trial in range(8):
            others = [
                row(output_ids=[1, 2, 3], **OTHERS[j])
                for j in rng.permutation(len(OTHERS))[: trial % 5 + 1]
            ]
            pos = int(rng.integers(0, len(others) + 1))
            batch = others[:pos] + [target] + others[pos:]
            torch.manual_seed(100 + trial)
            ids = sample(
                rand_logits(len(batch), vocab_size, 50 + trial, scale=0.7).index_copy(
                    0, torch.tensor([pos]), logits
                ),
                batch,
            ).next_ids
            assert ids[pos] == alone, (cfg, trial, [o.params for o in others])
        # a different step or a different seed draws afresh (the seed is really used)
        steps = {sample(logits, [row(output_ids=[0] * n, **cfg)]).next_ids[0] for n in range(12)}
        seeds = {
            sample(logits, [row(output_ids=[3, 4, 5, 6], **{**cfg, "seed": s})]).next_ids[0]
            for s in range(12)
        }
        assert len(steps) > 3 and len(seeds) > 3, (steps, seeds)


def test_seeded_draws_follow_the_distribution(draw):
    logits = rand_logits(1, 16, 10, scale=1.2)[0]
    configs = [dict(temperature=0.8), dict(top_k=6, top_p=0.85)]
    for cfg in configs:
        rows = [row(output_ids=[1] * (s % 7), seed=s // 7, **cfg) for s in range(3000)]
        ids = np.array(sample(logits.expand(len(rows), -1), rows).next_ids)
        counts = np.bincount(ids, minlength=16)
        assert chi2_pvalue(counts, np_expected(logits.numpy(), **cfg)) > 1e-4, (cfg, counts)


# ---------------------------------------------------------------- penalties


def penalty_rows(vocab_size: int, seed: int) -> list[SampleRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(12):
        cfg = dict(
            repetition_penalty=[1.0, 1.3, 0.7, 2.5][i % 4],
            frequency_penalty=[0.0, 0.5, -0.8, 1.7, 0.0, 0.3][i % 6],
            presence_penalty=[0.0, 1.2, 0.4, -1.0, 2.0][i % 5],
            temperature=0.0,
        )
        prompt = rng.integers(0, vocab_size, int(rng.integers(0, 15))).tolist()
        # repeats likely
        output = rng.integers(0, vocab_size // 4, int(rng.integers(0, 30))).tolist()
        rows.append(row(output_ids=output, prompt_ids=prompt, **cfg))
    return rows


def test_penalties_match_per_row_numpy():
    vocab_size = 64
    rows = penalty_rows(vocab_size, 11)
    logits = rand_logits(len(rows), vocab_size, 12)
    before = logits.clone()
    got = apply_penalties(logits, rows).numpy()
    assert torch.equal(logits, before)
    # strided input
    np.testing.assert_array_equal(apply_penalties(logits.T.contiguous().T, rows).numpy(), got)
    want = np.stack([np_penalised(logits[i].numpy(), r) for i, r in enumerate(rows)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.abs(want - logits.numpy()).max() > 1.0  # the penalties did something


def test_penalties_steer_greedy_choice():
    vocab_size = 64
    rows = penalty_rows(vocab_size, 13)
    logits = rand_logits(len(rows), vocab_size, 14)
    for r in rows:  # make the most likely token a seen one, so penalties can change the argmax
        if r.output_ids:
            logits[len([x for x in rows[: rows.index(r)]]), r.output_ids[0]] = 6.0
    want = [int(np.argmax(np_penalised(logits[i].numpy(), r))) for i, r in enumerate(rows)]
    assert sample(logits, rows).next_ids == want
    assert want != list(np.argmax(logits.numpy(), axis=1))


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_raw_log_softmax_and_top_sorted():
    vocab_size = 200
    logits = rand_logits(6, vocab_size, 15)
    allowed = torch.rand(6, vocab_size, generator=torch.Generator().manual_seed(1)) < 0.5
    allowed[:, 0] = True
    rows = [
        row(return_logprob=True, temperature=0.0),
        row(
            return_logprob=True,
            top_logprobs_num=5,
            temperature=0.7,
            top_p=0.9,
            repetition_penalty=1.4,
            output_ids=[1, 2, 2],
        ),
        row(),
        row(top_logprobs_num=3, top_k=4, blocked_ids=[0]),
        row(
            return_logprob=True,
            top_logprobs_num=20,
            min_p=0.1,
            frequency_penalty=1.0,
            output_ids=[7, 7],
        ),
        row(temperature=0.0),
    ]
    torch.manual_seed(3)
    res = sample(logits, rows, allowed)
    for i, r in enumerate(rows):
        asked = r.return_logprob or r.top_logprobs_num > 0
        if not asked:
            assert res.logprobs[i] is None and res.top_logprobs[i] is None
            continue
        ref = np_log_softmax(logits[i].numpy())
        assert res.logprobs[i] == pytest.approx(ref[res.next_ids[i]], abs=1e-5)
        top = res.top_logprobs[i]
        assert len(top) == r.top_logprobs_num
        assert [lp for lp, _ in top] == sorted((lp for lp, _ in top), reverse=True)
        want_ids = np.argsort(-ref)[: r.top_logprobs_num]
        assert [t for _, t in top] == list(want_ids)
        np.testing.assert_allclose([lp for lp, _ in top], ref[want_ids], atol=1e-5)
    assert sample(logits, [row() for _ in range(6)]).logprobs is None


def test_logit_bias_is_added_to_the_logits_after_penalties():
    logits = rand_logits(3, 50, seed=7)
    rows = [
        row(output_ids=[4, 4], repetition_penalty=1.3, logit_bias={"4": 2.5, "9": -100}),
        row(logit_bias={0: 100}),  # int keys work too
        row(),
    ]
    out = apply_penalties(logits, rows)
    expected = np_penalised(logits[0].numpy(), row(output_ids=[4, 4], repetition_penalty=1.3))
    expected[4] += 2.5
    expected[9] -= 100
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-6)
    assert sample(logits, rows).next_ids[1] == 0  # +100 wins the greedy pick
    # others untouched
    assert torch.equal(out[2], logits[2]) and torch.equal(logits, rand_logits(3, 50, seed=7))
