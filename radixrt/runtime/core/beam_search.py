"""Beam search's decisions, with transformers' semantics (`generate(num_beams=k,
do_sample=False, length_penalty=..., early_stopping=...)`, transformers 5.x), on plain lists: no
tensors, no requests.

Each step every live beam offers its best continuations (token, logprob); the search keeps the
overall best `num_candidates` by cumulative logprob, as HF's top-k over beams x vocabulary does
(num_candidates = max(2, 1 + number of stop ids) x width, so a full set of beams survives even when
the best ones all end). A candidate that ends (a stop id, or the max_new_tokens-th token) becomes a
finished hypothesis if it ranks among the first `width` and can still enter the best `width`
finished ones, scored sum_logprobs / generated_len ** length_penalty; the best `width` candidates
that do not end are the next step's beams. The search stops when no live beam can beat the worst
finished hypothesis any more (HF's heuristic, per `early_stopping`), when `early_stopping` is True
and `width` hypotheses are finished, or when every candidate ended.

Sums and scores are rounded to float32 as HF computes them, so that near-ties order the same way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EarlyStopping = bool | str  # True, False or "never" (HF's values)


def f32(x: float) -> float:
    """x rounded to the nearest float32 (HF keeps beam scores in float32 tensors)."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class Continuation:
    """A live beam's next token: the beam it extends (its index in this step's beams), the token,
    the token's logprob and the beam's cumulative logprob with it."""

    parent: int
    token: int
    logprob: float
    total: float


@dataclass(frozen=True)
class Hypothesis:
    """A finished sequence: its generated ids, cumulative logprob and length-penalised score."""

    output_ids: tuple[int, ...]
    cumulative_logprob: float
    score: float


class BeamSearch:
    def __init__(
        self,
        width: int,
        *,
        max_new_tokens: int,
        stop_ids: frozenset[int],
        length_penalty: float = 1.0,
        early_stopping: EarlyStopping = False,
    ):
        if width < 1 or max_new_tokens < 1:
            raise ValueError(f"beam search needs width >= 1 and max_new_tokens >= 1, got {width}")
        self.width = width
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        self.length_penalty = float(length_penalty)
        self.early_stopping = early_stopping
        self.num_candidates = max(2, 1 + len(stop_ids)) * width
        self.finished: list[Hypothesis] = []  # best first, at most width
        self.generated = 0  # tokens each live beam has generated
        self.improvable = True  # a live beam may still beat the worst finished hypothesis
        self.done = False

    def step(
        self,
        outputs: list[list[int]],
        totals: list[float],
        offers: list[list[tuple[float, int]]],
    ) -> list[Continuation]:
        """One step: beam b has generated outputs[b] with cumulative logprob totals[b] and offers
        its best (logprob, token) pairs (at least num_candidates of them where it has that many
        allowed). Returns the next step's beams, best first (empty once the search is done)."""
        assert not self.done and len(outputs) == len(totals) == len(offers) > 0
        candidates = self._best_candidates(totals, offers)
        length = self.generated + 1  # tokens of a beam extended by one of these candidates
        ends = [c.token in self.stop_ids or length >= self.max_new_tokens for c in candidates]
        self._add_finished(outputs, candidates[: self.width], ends[: self.width], length)
        running = [c for c, end in zip(candidates, ends) if not end][: self.width]
        self.generated = length
        self._update_improvable(running)
        all_full = len(self.finished) == self.width and self.early_stopping is True
        self.done = not running or not self.improvable or all_full
        return [] if self.done else running

    def results(self, num_return: int) -> list[Hypothesis]:
        """The best num_return finished hypotheses, best first (fewer when fewer exist: a grammar
        may allow only a few complete outputs)."""
        return self.finished[:num_return]

    def _best_candidates(
        self, totals: list[float], offers: list[list[tuple[float, int]]]
    ) -> list[Continuation]:
        candidates = [
            Continuation(parent=b, token=tok, logprob=lp, total=f32(f32(totals[b]) + f32(lp)))
            for b, beam_offers in enumerate(offers)
            for lp, tok in beam_offers
        ]
        # stable: equal totals keep beam order, then each beam's own (descending) order
        candidates.sort(key=lambda c: -c.total)
        return candidates[: self.num_candidates]

    def _add_finished(
        self,
        outputs: list[list[int]],
        top: list[Continuation],
        ends: list[bool],
        length: int,
    ) -> None:
        """The ending candidates among the top `width` become hypotheses, unless no new one may
        enter any more (the heuristic said so, or early_stopping and the set is full)."""
        full = len(self.finished) == self.width
        if not self.improvable or (full and self.early_stopping is True):
            return
        penalty = f32(length**self.length_penalty)
        new = [
            Hypothesis(tuple(outputs[c.parent]) + (c.token,), c.total, f32(c.total / penalty))
            for c, end in zip(top, ends)
            if end
        ]
        if new:
            merged = self.finished + new  # stable: an earlier hypothesis wins a tie
            merged.sort(key=lambda h: -h.score)
            self.finished = merged[: self.width]

    def _update_improvable(self, running: list[Continuation]) -> None:
        """HF's early-stop heuristic: once `width` hypotheses are finished, the best live beam's
        score at its present length (early_stopping "never" with a positive length penalty: at the
        longest length it may reach) must still beat the worst of them."""
        if not self.improvable or not running or len(self.finished) < self.width:
            return
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = self.generated
        best_possible = f32(running[0].total / f32(best_length**self.length_penalty))
        self.improvable = best_possible > self.finished[-1].score
