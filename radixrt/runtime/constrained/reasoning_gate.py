"""A grammar that starts after the thinking ends: a reasoning model's answer is constrained
(`response_format`, tools) while its `<think>...</think>` is not, as vLLM's reasoning-aware
structured output does (its `enable_in_reasoning=False`).

The request carries the end tag's token ids (RequestOptions.reasoning_end_ids); the gate wraps the
request's grammar state. While thinking: any token but EOS (an answer must follow), no drafts; the
thinking ends when the output's last tokens are the end tag's ids. From then on the wrapped grammar
decides every pick, drafts and the end, as it would for a request without thinking.

So that the answer still fits the budget, the end tag is forced (its tokens one by one) once the
picks left are only what the tag and the shortest valid answer need: the wrapped grammar's shortest
completion where its backend knows it (outlines' DFA distances, or the outlines shadow steering an
llguidance grammar), else a fixed reserve. Thinking that ends by itself earlier is untouched, so
output changes only where the answer would otherwise have been cut off.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from radixrt.runtime.constrained.budget import write_id_bits
from radixrt.runtime.constrained.regex_builder import GrammarError

# picks kept for the answer when the grammar's shortest completion is unknown (at most half the
# budget the thinking started with)
UNKNOWN_ANSWER_RESERVE = 64
MAX_END_IDS = 16


class ThinkingMask:
    """While thinking: every token but EOS (the answer is still to come)."""

    ended = False

    def __init__(self, eos_token_ids: list[int], num_words: int):
        self.eos_token_ids, self.num_words = eos_token_ids, num_words

    def write_bits(self, words: torch.Tensor) -> None:
        w = words.numpy().view(np.uint32)
        w.fill(0xFFFFFFFF)
        for e in self.eos_token_ids:
            if (e >> 5) < w.size:
                w[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)

    def eos_open(self) -> bool:
        return False


class ForcedToken:
    """The end tag's next token, alone."""

    ended = False

    def __init__(self, token_id: int, eos_token_ids: list[int], num_words: int):
        self.token_id, self.eos_token_ids, self.num_words = token_id, eos_token_ids, num_words

    def write_bits(self, words: torch.Tensor) -> None:
        write_id_bits(words, np.asarray([self.token_id], dtype=np.int64))

    def eos_open(self) -> bool:
        return False


class ThinkingGate:
    """A request's grammar state behind its thinking (the GrammarState protocol of core/req.py)."""

    def __init__(self, inner: Any, end_ids: list[int]):
        if not 1 <= len(end_ids) <= MAX_END_IDS:
            raise GrammarError(f"reasoning_end_ids must hold 1 to {MAX_END_IDS} token ids")
        self.inner = inner
        self.end_ids = list(end_ids)
        self.eos_token_ids = inner.eos_token_ids
        self.num_words = inner.num_words
        self.thinking = True
        self.thinking_ids: list[int] = []  # tokens accepted while thinking (the end tag included)
        self.forcing = False  # the end tag is being forced
        self.start_budget: int | None = None  # picks left at the first pick

    # -- tokens ------------------------------------------------------------------------------------
    def accept(self, token: int) -> None:
        if not self.thinking:
            self.inner.accept(token)
            return
        if token in self.eos_token_ids:
            raise GrammarError("EOS while thinking: the answer has not started")
        matched = self._matched()
        if self.forcing and token != self.end_ids[matched]:
            raise GrammarError(f"token {token} while the end of the thinking is forced")
        self.thinking_ids.append(token)
        if self.thinking_ids[-len(self.end_ids) :] == self.end_ids:
            self.thinking = self.forcing = False

    def _matched(self) -> int:
        """How many of the end tag's first ids the output ends with (the longest such prefix)."""
        for k in range(min(len(self.end_ids) - 1, len(self.thinking_ids)), 0, -1):
            if self.thinking_ids[-k:] == self.end_ids[:k]:
                return k
        return 0

    # -- what the scheduler asks ------------------------------------------------------------------
    def is_terminated(self) -> bool:
        return not self.thinking and self.inner.is_terminated()

    def is_final(self) -> bool:
        return not self.thinking and self.inner.is_final()

    def ends_at(self, state: Any) -> bool:
        return self.inner.ends_at(state)  # draft positions: only the answer drafts

    def draft(self, room: int) -> tuple[list[int], list[Any]]:
        return ([], []) if self.thinking else self.inner.draft(room)

    def at(self, state: Any, budget: int) -> Any:
        return self.inner.at(state, budget)

    def fork(self, output_ids: list[int]) -> ThinkingGate:
        """output_ids: every token accepted so far; the wrapped grammar replays the answer's."""
        if self.thinking:
            twin = ThinkingGate(self.inner.fork([]), self.end_ids)  # untouched while thinking
        else:
            answer = output_ids[len(self.thinking_ids) :]
            twin = ThinkingGate(self.inner.fork(answer), self.end_ids)
            twin.thinking = False
        twin.thinking_ids, twin.forcing = list(self.thinking_ids), self.forcing
        twin.start_budget = self.start_budget
        return twin

    def for_budget(self, budget: int) -> Any:
        if not self.thinking:
            return self.inner.for_budget(budget)
        if self.start_budget is None:
            self.start_budget = budget
        matched = self._matched()
        if not self.forcing and budget <= len(self.end_ids) - matched + self._answer_reserve():
            self.forcing = True
        if self.forcing:
            return ForcedToken(self.end_ids[matched], self.eos_token_ids, self.num_words)
        return ThinkingMask(self.eos_token_ids, self.num_words)

    def _answer_reserve(self) -> int:
        """Picks the answer needs at least: its shortest completion plus the EOS pick."""
        shortest = getattr(self.inner, "shortest_completion", lambda: None)()
        if shortest is not None:
            return shortest + 1
        return min(UNKNOWN_ANSWER_RESERVE, (self.start_budget or 0) // 2)


class GatedFuture:
    """A grammar future whose state comes wrapped in a ThinkingGate."""

    def __init__(self, future: Any, end_ids: list[int]):
        self._future, self._end_ids = future, list(end_ids)

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> ThinkingGate:
        return ThinkingGate(self._future.result(), self._end_ids)
