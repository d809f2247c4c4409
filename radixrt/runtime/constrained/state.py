"""Per-request grammar state and batched token masks.

Masks: outlines-core writes a 32-bit-word bitmask straight into our buffer (no Python lists
of ids); fill_masks unpacks the words of the whole batch at once. The outlines vocabulary
holds one EOS id; every id of `eos_token_ids` is allowed exactly when the FSM is in a final
state. Ids past the tokenizer (vocab_size may exceed len(tokenizer)) are never allowed.

Jump-forward: `draft()` gives the tokens the grammar forces from here (draft.py);
the scheduler feeds them for the model to verify, and `StateMask` writes the mask of each
state along the draft so that every verified position is masked as one-by-one decoding is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from outlines_core import Guide, Index

from radixrt.runtime.constrained.budget import SteeredMask, Steering, write_id_bits
from radixrt.runtime.constrained.draft import Drafter
from radixrt.runtime.constrained.regex_builder import GrammarError

HEAVY_STATE_TOKENS = 2048  # states allowing more tokens than this keep their mask row cached


class CompiledGrammar:
    """One Index shared by every request with the same (kind, spec), plus per-state facts."""

    def __init__(
        self,
        index: Index,
        eos_id: int,
        description: str,
        num_words: int,
        distances: tuple[dict[int, int], dict[int, int]] | None = None,
    ):
        self.index = index
        # budget steering (budget.py); None when the compile worker could not afford the table
        self.steering = Steering(index, *distances, eos_id) if distances is not None else None
        self.eos_id = eos_id
        self.description = description
        self.num_words = num_words
        self._facts: dict[int, tuple[bool, int]] = {}  # state -> (has non-EOS, number allowed)
        self._rows: dict[int, torch.Tensor] = {}  # bitmask rows of states with many allowed tokens
        self._ids: dict[int, np.ndarray] = {}  # allowed ids of light states along drafts
        # jump-forward caches, filled by draft.Drafter
        self.forced_byte: dict[int, int] = {}
        self.drafts: dict[int, tuple[list[int], list[int]]] = {}

    def facts(self, state: int) -> tuple[bool, int]:
        f = self._facts.get(state)
        if f is None:
            allowed = self.index.get_allowed_tokens(state) or []
            f = self._facts[state] = (any(t != self.eos_id for t in allowed), len(allowed))
        return f

    def write_state_bits(self, state: int, words: torch.Tensor) -> None:
        """The mask of any state, built from the index (no Guide needs to stand there), for
        positions along a jump-forward draft. Heavy states share the cached rows; a light state
        keeps only its allowed ids (a few bytes each, where a row costs vocab/8), so caching every
        draft state stays small."""
        if self.facts(state)[1] >= HEAVY_STATE_TOKENS:
            row = self._rows.get(state)
            if row is None:
                bits = np.zeros(self.num_words * 32, dtype=np.bool_)
                bits[np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)] = True
                row = self._rows[state] = torch.from_numpy(
                    np.packbits(bits, bitorder="little").view(np.int32)
                )
            words.copy_(row[: words.numel()])
            return
        ids = self._ids.get(state)
        if ids is None:
            ids = self._ids[state] = np.asarray(
                self.index.get_allowed_tokens(state) or [], dtype=np.int32
            )
        write_id_bits(words, ids)

    def write_bits(self, state: int, guide: Guide, words: torch.Tensor) -> None:
        """outlines-core walks a state's whole transition map to write its mask (~100 µs for the
        ~49k tokens allowed inside a JSON string); such states recur step after step, so their
        rows are kept and copied (a few KB) instead."""
        if self.facts(state)[1] < HEAVY_STATE_TOKENS:
            guide.write_mask_into(words.data_ptr(), words.numel(), 4)
            return
        row = self._rows.get(state)
        if row is None:
            row = torch.zeros(words.numel(), dtype=torch.int32)
            guide.write_mask_into(row.data_ptr(), row.numel(), 4)
            self._rows[state] = row
        words.copy_(row)


class EosGate:
    """What a per-request grammar state of any backend shares: the EOS ids are allowed exactly where
    the grammar accepts, EOS is taken at most once, and after it nothing is allowed. A backend
    subclass gives is_final, _write_allowed (its mask row) and _advance (one non-EOS token)."""

    description: str
    eos_token_ids: list[int]
    num_words: int
    _eos_accepted = False

    def is_final(self) -> bool:
        raise NotImplementedError

    def _write_allowed(self, words: torch.Tensor) -> None:
        raise NotImplementedError

    def _advance(self, token_id: int) -> None:
        raise NotImplementedError

    @property
    def ended(self) -> bool:
        """EOS was taken: nothing may follow (the mask row is empty)."""
        return self._eos_accepted

    def eos_open(self) -> bool:
        """EOS ids must be allowed: the grammar accepts here and has not taken EOS yet."""
        return not self._eos_accepted and self.is_final()

    def write_bits(self, words: torch.Tensor) -> None:
        """Write this state's allowed ids into one contiguous CPU int32 row of num_words words."""
        assert (
            words.dtype == torch.int32 and words.is_contiguous() and words.numel() >= self.num_words
        )
        if self._eos_accepted:
            words.zero_()
            return
        self._write_allowed(words)

    def fork(self, tokens: list[int]) -> "EosGate":
        """A state of its own at the same place, for a beam that splits off (beam_group.py);
        tokens: every token this state accepted, in order (a backend may replay them)."""
        raise NotImplementedError

    def accept(self, token_id: int) -> None:
        if self._eos_accepted:
            raise GrammarError(f"token {token_id} after the grammar already ended")
        if token_id in self.eos_token_ids:
            if not self.is_final():
                raise GrammarError(
                    f"EOS token {token_id} before the {self.description} is complete"
                )
            self._eos_accepted = True
            return
        self._advance(token_id)


class GrammarState(EosGate):
    """Per-request FSM position (outlines-core). Used only by the scheduler thread."""

    def __init__(
        self,
        compiled: CompiledGrammar,
        eos_token_ids: list[int],
        vocab_size: int,
        num_words: int,
        drafter: Drafter | None,
    ):
        self.compiled = compiled
        self.description = compiled.description
        self.guide = Guide(compiled.index, max_rollback=0)
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.num_words = num_words
        self.drafter = drafter  # None: jump-forward off

    def is_final(self) -> bool:
        """The text so far is a complete match: EOS is allowed now."""
        return self.guide.is_finished()

    def fork(self, tokens: list[int]) -> "GrammarState":
        """outlines-core's Guide cannot be set to a state: a fresh one replays the tokens (a
        DFA walk, microseconds per token)."""
        twin = GrammarState(
            self.compiled, self.eos_token_ids, self.vocab_size, self.num_words, self.drafter
        )
        for token_id in tokens:
            twin.accept(token_id)
        return twin

    def _write_allowed(self, words: torch.Tensor) -> None:
        self.compiled.write_bits(self.guide.get_state(), self.guide, words)

    def fill_mask(self, mask_row: torch.Tensor) -> None:
        mask = fill_masks([self], mask_row.shape[-1], mask_row.device)
        if mask_row.device.type == "cpu" and mask_row.is_contiguous():
            np.copyto(mask_row.numpy(), mask[0].numpy())
        else:
            mask_row.copy_(mask[0])

    def _advance(self, token_id: int) -> None:
        try:
            self.guide.advance(token_id, return_tokens=False)
        except ValueError:
            raise GrammarError(
                f"token {token_id} is not allowed by the {self.compiled.description} here"
            ) from None

    def is_terminated(self) -> bool:
        if self._eos_accepted:
            return True
        return self.guide.is_finished() and not self.compiled.facts(self.guide.get_state())[0]

    def ends_at(self, state: int) -> bool:
        """At `state` the grammar is over: the match is complete and nothing but EOS may follow."""
        return self.compiled.index.is_final_state(state) and not self.compiled.facts(state)[0]

    def draft(self, max_tokens: int) -> tuple[list[int], list[int]]:
        """Forced tokens from here and the state after each (not accepted); ([], []) when off or
        none."""
        if self.drafter is None or self._eos_accepted or max_tokens <= 0:
            return [], []
        ids, states = self.drafter.draft(self.compiled, self.guide.get_state())
        return ids[:max_tokens], states[:max_tokens]

    def at(self, state: int, budget: int) -> "StateMask | SteeredMask":
        """The mask source of another state of this grammar (a position along a draft), `budget`
        picks left there."""
        steered = self.steered_at(state, budget)
        return (
            steered if steered is not None else StateMask(self.compiled, state, self.eos_token_ids)
        )

    def for_budget(self, budget: int) -> "GrammarState | SteeredMask":
        """The mask source of this request's next pick with `budget` picks left (this one included):
        itself, or a steered mask near the end of the budget (budget.py)."""
        if self._eos_accepted:
            return self
        steered = self.steered_at(self.guide.get_state(), budget)
        return steered if steered is not None else self

    def shortest_completion(self) -> int | None:
        """The fewest tokens that complete a match from here (None: no distance table)."""
        steering = self.compiled.steering
        if steering is None:
            return None
        return steering.dist.get(self.guide.get_state())

    def steered_at(self, state: int, budget: int) -> SteeredMask | None:
        """The steered mask at `state` with `budget` picks left, or None where steering removes
        nothing."""
        steering = self.compiled.steering
        if steering is None or not steering.engages(state, budget):
            return None
        return SteeredMask(
            steering,
            state,
            budget,
            self.compiled.index.is_final_state(state),
            self.eos_token_ids,
            self.num_words,
        )


class StateMask:
    """Mask of a state no Guide stands on: a draft position that is being verified."""

    def __init__(self, compiled: CompiledGrammar, state: int, eos_token_ids: list[int]):
        self.compiled = compiled
        self.state = state
        self.eos_token_ids = eos_token_ids
        self.num_words = compiled.num_words

    ended = False

    def write_bits(self, words: torch.Tensor) -> None:
        self.compiled.write_state_bits(self.state, words)

    def eos_open(self) -> bool:
        return self.compiled.index.is_final_state(self.state)


def fill_masks(
    states: list[GrammarState | StateMask | SteeredMask | None], vocab_size: int, device: Any
) -> torch.Tensor | None:
    """[B, vocab_size] bool: True where allowed; rows of None (unconstrained) are all True.
    On the CPU the result is a view into the unpacked bits (row stride a multiple of 32)."""
    live = [s for s in states if s is not None]
    if not live:
        return None
    num_words = max(s.num_words for s in live)
    assert num_words * 32 >= vocab_size
    device = torch.device(device)
    pin = device.type == "cuda"
    words = torch.full((len(states), num_words), -1, dtype=torch.int32, pin_memory=pin)
    words_np = words.numpy()
    extra_eos: list[tuple[int, int]] = []
    for i, s in enumerate(states):
        if s is None:
            continue
        s.write_bits(words[i])
        if s.ended:
            continue
        # final: every EOS id is allowed; a row with no way on (impossible with a byte-complete
        # vocabulary) also gets EOS so that sampling never sees an all -inf row
        if s.eos_open() or not words_np[i].any():
            extra_eos += [(i, e) for e in s.eos_token_ids if e < vocab_size]
    if device.type == "cpu":  # numpy: no intra-op thread pool spun up for a few KB of work
        bits = np.unpackbits(words_np.view(np.uint8), axis=1, bitorder="little").view(np.bool_)[
            :, :vocab_size
        ]
        for row, col in extra_eos:
            bits[row, col] = True
        return torch.from_numpy(bits)
    # ship 32x fewer bytes, unpack on the device
    w = words.to(device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    mask = ((w.unsqueeze(-1) >> shifts) & 1).bool().view(len(states), -1)[:, :vocab_size]
    if extra_eos:
        rows, cols = zip(*extra_eos)
        mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    return mask
