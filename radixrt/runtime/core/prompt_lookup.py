"""Prompt-lookup drafts (n-gram speculation): guess a request's next tokens from its own text.

Few-shot prompts, extraction, code edits and chat that quotes its context repeat spans of the
prompt (or of the output so far). When the last n tokens (n = 3, else 2) occurred earlier, the
tokens that followed that latest occurrence are the draft. The scheduler feeds the draft after
the request's last token and keeps it up to the model's first disagreeing pick (core/drafts.py,
the path jump-forward drafts take), so output is token-by-token decoding's: a wrong draft costs
compute, never correctness.

On a CPU a decode step reads every weight once whatever its row count (bandwidth-bound up to
~64 rows), so a verified draft token is almost free; a rejected one costs attention and sampling.
A request whose drafts keep missing waits longer and longer before it drafts again.
"""

from __future__ import annotations

from typing import Callable

NGRAM_SIZES = (3, 2)  # longest first: a longer match predicts better
# most recent tokens indexed: bounds the index (~2 entries a token) for very long prompts
LOOKUP_WINDOW = 8192
MAX_BACKOFF_STEPS = 16


class PromptLookup:
    """One request's n-gram index: for every n-gram, where its latest earlier occurrence ended."""

    def __init__(self, num_draft: int):
        self.num_draft = num_draft
        # n-gram -> position just after its latest occurrence
        self._next: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in _next
        self._wait = 0  # steps to skip before drafting again
        self._backoff = 1

    def propose(
        self, tokens: list[int], limit: int, from_tree: Callable[[int], list[int]] | None = None
    ) -> list[int]:
        """Up to min(num_draft, limit) tokens to try after `tokens` (the request's prompt +
        output): what the radix tree holds after them (from_tree: tree_drafts.tree_draft) or
        the n-gram guess, whichever is longer (the tree's on a tie)."""
        n_tok = len(tokens)
        self._index(tokens, n_tok - 1)  # every n-gram but the tail's own: its sequel is unknown
        if self._wait > 0:
            self._wait -= 1
            return []
        limit = min(self.num_draft, limit)
        if limit <= 0:
            return []
        best = from_tree(limit) if from_tree is not None else []
        if len(best) >= limit:
            return best
        for n in NGRAM_SIZES:
            if n_tok <= n:
                continue
            start = self._next.get(tuple(tokens[n_tok - n :]))
            if start is not None:
                guess = tokens[start : start + limit]
                return guess if len(guess) > len(best) else best
        return best

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """The verdict on the last draft: a draft that missed at its first token doubles the
        wait."""
        if num_accepted == 0 and num_drafted:
            self._wait = self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_STEPS)
        elif num_accepted:
            self._backoff = 1

    def _index(self, tokens: list[int], end: int) -> None:
        """Index the n-grams ending at positions [self._indexed, end)."""
        first = max(self._indexed, end - LOOKUP_WINDOW)
        for e in range(first, end):
            for n in NGRAM_SIZES:
                if e + 1 >= n:
                    self._next[tuple(tokens[e + 1 - n : e + 1])] = e + 1
        self._indexed = max(self._indexed, end)
