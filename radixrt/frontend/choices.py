"""How `select` turns per-choice prompt logprobs into a decision (SGLang's three methods).

Each method gets, per choice, the logprobs of the choice's own tokens given the prefix
(`input_token_logprobs`: lists of (logprob, token_id, text) entries) and returns a
ChoicesDecision. The backend computes the logprobs; the methods are pure functions.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] | None = None


def _values(entries: list[Any]) -> list[float]:
    # The very first prompt token has no logprob (None); it carries no evidence.
    return [float(e[0]) for e in entries if e[0] is not None]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _pick(scores: list[float], temperature: float, rng: random.Random | None) -> int:
    """argmax (first on ties) at temperature 0, else a softmax(score / T) draw."""
    if temperature <= 1e-6:
        return max(range(len(scores)), key=scores.__getitem__)
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    return (rng or random).choices(range(len(scores)), weights=weights)[0]


def normalized_prompt_logprobs(input_token_logprobs: list[list[Any]]) -> list[float]:
    return [_mean(_values(entries)) for entries in input_token_logprobs]


class TokenLengthNormalized:
    """Highest mean token logprob of the choice."""

    requires_unconditional_logprobs = False

    def __call__(
        self,
        *,
        choices,
        input_token_logprobs,
        unconditional_token_logprobs=None,
        temperature=0.0,
        rng=None,
        output_token_logprobs=None,
        **_: Any,
    ) -> ChoicesDecision:
        scores = normalized_prompt_logprobs(input_token_logprobs)
        best = _pick(scores, temperature, rng)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": scores,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )

    def __repr__(self) -> str:
        return "token_length_normalized"


class GreedyTokenSelection:
    """Walk token positions left to right, keeping the choices with the best logprob at each.

    A shorter choice is padded with its own mean logprob, so "Paris" can still beat
    "Paris, France" when the extra tokens are unlikely.
    """

    requires_unconditional_logprobs = False

    def __call__(
        self,
        *,
        choices,
        input_token_logprobs,
        unconditional_token_logprobs=None,
        temperature=0.0,
        rng=None,
        output_token_logprobs=None,
        **_: Any,
    ) -> ChoicesDecision:
        rows = [_values(entries) for entries in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            choices[remaining[0]],
            {
                "normalized_prompt_logprobs": normalized_prompt_logprobs(input_token_logprobs),
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "greedy_logprob_matrix": matrix,
            },
        )

    def __repr__(self) -> str:
        return "greedy_token_selection"


class UnconditionalLikelihoodNormalized:
    """Highest mean of (logprob given the prefix - logprob of the choice on its own).

    Corrects for choices that are likely anywhere (short, common words).
    """

    requires_unconditional_logprobs = True

    def __call__(
        self,
        *,
        choices,
        input_token_logprobs,
        unconditional_token_logprobs=None,
        temperature=0.0,
        rng=None,
        output_token_logprobs=None,
        **_: Any,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError(
                "unconditional_likelihood_normalized needs unconditional token logprobs"
            )
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs cover different tokens")
            # The choice's first token has no unconditional logprob (nothing precedes it): 0.
            diffs = [
                c[0] - (u[0] if u[0] is not None else 0.0)
                for c, u in zip(cond, uncond)
                if c[0] is not None
            ]
            scores.append(_mean(diffs))
        best = _pick(scores, temperature, rng)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": normalized_prompt_logprobs(input_token_logprobs),
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "unconditional_token_logprobs": unconditional_token_logprobs,
                "normalized_unconditional_prompt_logprobs": scores,
            },
        )

    def __repr__(self) -> str:
        return "unconditional_likelihood_normalized"


BUILTIN_METHODS = (TokenLengthNormalized, GreedyTokenSelection, UnconditionalLikelihoodNormalized)
token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
