"""Per-request state of the xgrammar backend (xgrammar_backend.py): an xgrammar GrammarMatcher
behind the interface every backend's state has (state.EosGate: masks, accept, EOS exactly where the
grammar accepts; drafts; fork; budget steering by an outlines shadow).

The outlines shadow (fallback.Shadow: follow, at, for_budget) is LLGState's, backend-neutral, and
inherited from it; the matcher-specific parts are xgrammar's here.

Masks: xgrammar writes the same 32-bit-word bitmask we use (token i is bit i % 32 of word i // 32).
A state's row is computed once per position and kept until its next token (is_terminated reads it
too). The EOS ids are cleared from xgrammar's row: fill_masks adds them exactly where the grammar
accepts (is_completed), as for every backend.

Jump-forward: the text xgrammar says the grammar forces (find_jump_forward_string), tokenized
canonically (the tokenizer's own encode) as outlines' drafts are, kept while each token spells the
next forced bytes and the matcher accepts it; the last token is dropped when a longer allowed token
could span the end of the forced text (`"` then `":`). The matcher walks the draft to record the
mask at each position and is rolled back.
"""

from __future__ import annotations

import bisect
import functools
from typing import Any

import numpy as np
import torch

from radixrt.runtime.constrained.llg_backend import LLGState
from radixrt.runtime.constrained.regex_builder import GrammarError

MAX_DRAFT_TOKENS = 16


class ForcedText:
    """Tokenizes forced text into draft ids: the tokenizer's own encoding, checked against each
    token's spelling (xgrammar's decoded vocabulary)."""

    def __init__(self, tokenizer: Any, decoded_vocab: list[bytes]):
        self.tokenizer = tokenizer
        self.spelling = decoded_vocab
        order = sorted(range(len(decoded_vocab)), key=lambda i: decoded_vocab[i])
        self._sorted = [decoded_vocab[i] for i in order]
        self._sorted_ids = np.asarray(order, dtype=np.int64)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one per backend, bounded
    def longer_than(self, tail: bytes) -> np.ndarray:
        """Ids of the tokens that spell `tail` and go on past it (sorted bytes: those with the
        prefix `tail` sit between tail and the first string past every such prefix)."""
        lo = bisect.bisect_right(self._sorted, tail)
        end = tail.rstrip(b"\xff")
        hi = (
            bisect.bisect_left(self._sorted, end[:-1] + bytes([end[-1] + 1]))
            if end
            else len(self._sorted)
        )
        return self._sorted_ids[lo:hi]


def _has_any(words: np.ndarray, ids: np.ndarray) -> bool:
    ids = ids[ids < words.size * 32]
    return bool(((words[ids >> 5] >> (ids & 31).astype(np.int32)) & 1).any())


class XGrammarPosition:
    """The mask at a draft position (after some forced tokens), as LLGState's positions."""

    ended = False

    def __init__(
        self, words: np.ndarray, accepting: bool, stopped: bool, eos_ids: list, shadow_state: Any
    ):
        self.words, self.accepting, self.stopped = words, accepting, stopped
        self.shadow_state = shadow_state  # the outlines shadow's DFA state here, else None
        self.eos_token_ids = eos_ids
        self.num_words = words.size

    def write_bits(self, words: torch.Tensor) -> None:
        _copy_row(self.words, words)

    def eos_open(self) -> bool:
        return self.accepting


def _copy_row(row: np.ndarray, words: torch.Tensor) -> None:
    """Our row into a batch row that may be longer (another backend's vocabulary bound)."""
    out = words.numpy()
    out[: row.size] = row
    out[row.size :] = 0


class XGrammarState(LLGState):
    """Per-request xgrammar matcher. Used only by the scheduler thread."""

    def __init__(
        self,
        matcher: Any,
        description: str,
        eos_token_ids: list[int],
        num_words: int,
        forced: ForcedText | None,
    ):
        super().__init__(matcher, description, eos_token_ids, num_words, forced is not None)
        self.forced = forced
        # the mask here, filled once per position (until the next token) into a buffer of its own
        self._buf = torch.empty((1, num_words), dtype=torch.int32)
        self._row, self._fresh = self._buf.numpy()[0], False
        # xgrammar's stop ids (ours, or those it found): (word, mask clearing its bit)
        self._stop = [
            (t >> 5, np.int32(~(1 << (t & 31)) if t & 31 < 31 else 0x7FFFFFFF))
            for t in matcher.stop_token_ids
        ]

    def is_final(self) -> bool:
        return self.matcher.is_completed()

    def fork(self, tokens: list[int]) -> "XGrammarState":
        """The matcher forked (xgrammar copies its parser state); the outlines shadow along."""
        twin = XGrammarState(
            self.matcher.fork(), self.description, self.eos_token_ids, self.num_words, self.forced
        )
        twin.confine, twin._eos_accepted = self.confine, self._eos_accepted
        if self.shadow is not None:
            twin.shadow = self.shadow.fork(tokens)
        return twin

    def _fill_row(self, buf: torch.Tensor | None = None) -> np.ndarray:
        """The matcher's mask without the stop ids, into buf (a new row by default)."""
        buf = torch.empty((1, self.num_words), dtype=torch.int32) if buf is None else buf
        self.matcher.fill_next_token_bitmask(buf, 0)  # writes every word
        row = buf.numpy()[0]
        for word, keep in self._stop:
            row[word] &= keep
        return row

    def _mask(self) -> np.ndarray:
        if not self._fresh:
            self._fill_row(self._buf)
            self._fresh = True
        return self._row

    def _write_allowed(self, words: torch.Tensor) -> None:
        _copy_row(self._mask(), words)

    def _advance(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise GrammarError(
                f"token {token_id} is not allowed by the xgrammar {self.description}"
            )
        self._fresh = False
        if self.shadow is not None:
            self.shadow.accept(token_id)

    def is_terminated(self) -> bool:
        """EOS taken, or the grammar is complete and nothing but EOS may follow."""
        if self._eos_accepted:
            return True
        return self.matcher.is_completed() and not self._mask().any()

    def draft(self, max_tokens: int) -> tuple[list[int], list[XGrammarPosition]]:
        """The tokens the grammar forces from here and the mask after each (the matcher walks them
        and is rolled back)."""
        if self.forced is None or self._eos_accepted or max_tokens <= 0:
            return [], []
        if self.matcher.is_completed():  # EOS may end it here: nothing is forced
            return [], []
        text = self.matcher.find_jump_forward_string()
        if not text:
            return [], []
        forced = text.encode("utf-8")
        shadow = self.shadow.current() if self.shadow is not None else None
        shadow_state = shadow.guide.get_state() if shadow is not None else None
        ids, positions, starts = [], [], [0]
        try:
            for tok in self.forced.encode(text)[: min(max_tokens, MAX_DRAFT_TOKENS)]:
                spelled = self.forced.spelling[tok] if tok < len(self.forced.spelling) else b""
                pos = starts[-1]
                if not spelled or forced[pos : pos + len(spelled)] != spelled:
                    break  # a tokenizer that normalises or prefixes text: keep what matched
                if not self.matcher.accept_token(tok):
                    break
                ids.append(tok)
                starts.append(pos + len(spelled))
                if shadow_state is not None:  # None once the text leaves the shadow's language
                    shadow_state = shadow.compiled.index.get_next_state(shadow_state, tok)
                row = self._fill_row()
                completed = self.matcher.is_completed()
                positions.append(
                    XGrammarPosition(
                        row,
                        completed,
                        completed and not row.any(),
                        self.eos_token_ids,
                        shadow_state,
                    )
                )
        finally:
            if ids:
                self.matcher.rollback(len(ids))
        if ids and starts[-1] == len(forced):
            # the forced text ends where the output branches: a longer token may span that end
            before = positions[-2].words if len(ids) > 1 else self._mask()
            if _has_any(before, self.forced.longer_than(forced[starts[-2] :])):
                ids.pop()
                positions.pop()
        return ids, positions
