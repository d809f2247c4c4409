"""Constrained decoding: regex / JSON schema / choices -> outlines-core index -> token masks.

Flow: `validate` (synchronous, at the edge) turns the spec into a regex and raises GrammarError
for anything we cannot enforce. `request` returns a GrammarFuture at once; a daemon thread
builds the outlines-core Index (Rust; it releases the GIL, so decoding of other requests goes
on). Compiled indexes are shared through a bounded LRU keyed by (kind, spec); a compile that
outlives `compile_timeout` fails its request with GrammarError (the thread may finish later and
fill the cache; a daemon thread never blocks interpreter exit).

Masks: outlines-core writes a 32-bit-word bitmask straight into our buffer (no Python lists
of ids); fill_masks unpacks the words of the whole batch at once. The outlines vocabulary
holds one EOS id; every id of `eos_token_ids` is allowed exactly when the FSM is in a final
state. Ids past the tokenizer (vocab_size may exceed len(tokenizer)) are never allowed.

Jump-forward is token-level only: while the current state allows exactly one token (and is
not final, so EOS is not an option), that token is appended without running the model.
Under greedy decoding the model would have picked that same token (the mask leaves it the
only finite logit), so output with jump-forward on equals output with it off, token for
token. A string-level jump (SGLang's: take the forced *string*, e.g. `{"name": "`, and
retokenize it) cannot promise that: the canonical tokenization of the forced string can
differ from the split the model would choose token by token (`{"` + `name` vs `{` + `"name`),
and the model's later tokens depend on that split. We keep the equality and give up the
longer jumps; in byte-level BPE vocabularies forced single tokens occur mostly inside
long keys and after partial enum values.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from outlines_core import Guide, Index, Vocabulary

from radixrt.runtime.grammar_pattern import check_user_regex
from radixrt.runtime.grammar_regex import GrammarError
from radixrt.runtime.grammar_vocab import token_bytes_map
from radixrt.runtime.json_schema_regex import choices_regex, json_object_regex, schema_to_regex

__all__ = ["GrammarError", "GrammarBackend", "GrammarFuture", "GrammarState", "fill_masks", "KINDS"]
KINDS = ("regex", "json_schema", "choices", "json_object")
JSON_OBJECT_DEPTH = 2  # nesting levels of a response_format json_object (outer object included)
HEAVY_STATE_TOKENS = 2048  # states allowing more tokens than this keep their mask row cached


class CompiledGrammar:
    """One Index shared by every request with the same (kind, spec), plus per-state facts."""

    def __init__(self, index: Index, eos_id: int, description: str, num_words: int):
        self.index = index
        self.eos_id = eos_id
        self.description = description
        self.num_words = num_words
        self._facts: dict[int, tuple[int, bool, int]] = {}  # state -> (forced token or -1, has non-EOS, count)
        self._rows: dict[int, torch.Tensor] = {}  # bitmask of states with many allowed tokens

    def facts(self, state: int) -> tuple[int, bool, int]:
        f = self._facts.get(state)
        if f is None:
            allowed = self.index.get_allowed_tokens(state) or []
            non_eos = [t for t in allowed if t != self.eos_id]
            forced = non_eos[0] if len(allowed) == 1 and len(non_eos) == 1 else -1
            f = self._facts[state] = (forced, bool(non_eos), len(allowed))
        return f

    def write_bits(self, state: int, guide: Guide, words: torch.Tensor) -> None:
        """outlines-core walks a state's whole transition map to write its mask (~100 µs for the
        ~49k tokens allowed inside a JSON string); such states recur step after step, so their
        rows are kept and copied (a few KB) instead."""
        if self.facts(state)[2] < HEAVY_STATE_TOKENS:
            guide.write_mask_into(words.data_ptr(), words.numel(), 4)
            return
        row = self._rows.get(state)
        if row is None:
            row = torch.zeros(words.numel(), dtype=torch.int32)
            guide.write_mask_into(row.data_ptr(), row.numel(), 4)
            self._rows[state] = row
        words.copy_(row)


class GrammarState:
    """Per-request FSM position. Used only by the scheduler thread."""

    def __init__(self, compiled: CompiledGrammar, eos_token_ids: list[int], vocab_size: int, num_words: int,
                 enable_jump_forward: bool):
        self.compiled = compiled
        self.guide = Guide(compiled.index, max_rollback=0)
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.num_words = num_words
        self.enable_jump_forward = enable_jump_forward
        self._eos_accepted = False

    def is_final(self) -> bool:
        """The text so far is a complete match: EOS is allowed now."""
        return self.guide.is_finished()

    def write_bits(self, words: torch.Tensor) -> None:
        """Write this state's allowed ids into one contiguous CPU int32 row of num_words words."""
        assert words.dtype == torch.int32 and words.is_contiguous() and words.numel() >= self.num_words
        if self._eos_accepted:
            words.zero_()
            return
        self.compiled.write_bits(self.guide.get_state(), self.guide, words)

    def fill_mask(self, mask_row: torch.Tensor) -> None:
        mask = fill_masks([self], mask_row.shape[-1], mask_row.device)
        if mask_row.device.type == "cpu" and mask_row.is_contiguous():
            np.copyto(mask_row.numpy(), mask[0].numpy())
        else:
            mask_row.copy_(mask[0])

    def accept(self, token_id: int) -> None:
        if self._eos_accepted:
            raise GrammarError(f"token {token_id} after the grammar already ended")
        if token_id in self.eos_token_ids:
            if not self.guide.is_finished():
                raise GrammarError(f"EOS token {token_id} before the {self.compiled.description} is complete")
            self._eos_accepted = True
            return
        try:
            self.guide.advance(token_id, return_tokens=False)
        except ValueError:
            raise GrammarError(f"token {token_id} is not allowed by the {self.compiled.description} here") from None

    def is_terminated(self) -> bool:
        if self._eos_accepted:
            return True
        return self.guide.is_finished() and not self.compiled.facts(self.guide.get_state())[1]

    def jump_forward(self, max_tokens: int | None = None) -> list[int]:
        """Forced token chain from here (accepted into the state); [] when disabled or none."""
        out: list[int] = []
        if not self.enable_jump_forward or self._eos_accepted:
            return out
        while max_tokens is None or len(out) < max_tokens:
            forced = self.compiled.facts(self.guide.get_state())[0]
            if forced < 0:
                break
            self.guide.advance(forced, return_tokens=False)
            out.append(forced)
        return out


def fill_masks(states: list[GrammarState | None], vocab_size: int, device: Any) -> torch.Tensor | None:
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
        if s._eos_accepted:
            continue
        # final: every EOS id is allowed; a row with no way on (impossible with a byte-complete
        # vocabulary) also gets EOS so that sampling never sees an all -inf row
        if s.guide.is_finished() or not words_np[i].any():
            extra_eos += [(i, e) for e in s.eos_token_ids if e < vocab_size]
    if device.type == "cpu":  # numpy: no intra-op thread pool spun up for a few KB of work
        bits = np.unpackbits(words_np.view(np.uint8), axis=1, bitorder="little").view(np.bool_)[:, :vocab_size]
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


class GrammarFuture:
    def __init__(self, backend: "GrammarBackend", kind: str, future: Future, deadline: float):
        self._backend = backend
        self._kind = kind
        self._future = future
        self._deadline = deadline

    def done(self) -> bool:
        return self._future.done() or time.monotonic() >= self._deadline

    def result(self) -> GrammarState:
        assert self.done(), "GrammarFuture.result() called before done()"
        if not self._future.done():
            raise GrammarError(f"compiling the {self._kind} grammar took longer than "
                               f"{self._backend.compile_timeout:g} s (grammar_compile_timeout)")
        exc = self._future.exception()
        if exc is not None:
            raise exc if isinstance(exc, GrammarError) else GrammarError(f"{self._kind} grammar: {exc}")
        return self._backend._new_state(self._future.result())


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], cache_size: int = 256,
                 compile_timeout: float = 10.0, enable_jump_forward: bool = True):
        if cache_size < 1 or compile_timeout <= 0:
            raise ValueError("cache_size must be >= 1 and compile_timeout > 0")
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted({int(e) for e in eos_token_ids})
        self.cache_size = cache_size
        self.compile_timeout = compile_timeout
        self.enable_jump_forward = enable_jump_forward
        token_map = token_bytes_map(tokenizer, vocab_size)
        for e in self.eos_token_ids:  # EOS is the grammar's to allow, never a spelled token
            for ids in token_map.values():
                if e in ids:
                    ids.remove(e)
        token_map = {b: ids for b, ids in token_map.items() if ids}
        # outlines wants one EOS id outside the map; with none given use an id past the logits
        self._fsm_eos = self.eos_token_ids[0] if self.eos_token_ids else vocab_size
        self._vocab = Vocabulary(self._fsm_eos, token_map)
        max_id = max([self._fsm_eos, vocab_size - 1] + [max(ids) for ids in token_map.values()])
        self.num_words = (max_id + 1 + 31) // 32
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple, CompiledGrammar | GrammarError] = collections.OrderedDict()
        self._pending: dict[tuple, Future] = {}
        self._regex_cache: collections.OrderedDict[tuple, str] = collections.OrderedDict()

    # -- spec -> regex ------------------------------------------------------------------------
    @staticmethod
    def _key(kind: str, spec: Any) -> tuple:
        if kind not in KINDS:
            raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")
        if kind == "json_schema":
            if isinstance(spec, (str, bytes)):
                try:
                    spec = json.loads(spec)
                except ValueError as e:
                    raise GrammarError(f"json_schema is not valid JSON: {e}") from None
            try:
                return kind, json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
            except (TypeError, ValueError) as e:
                raise GrammarError(f"json_schema is not JSON-serialisable: {e}") from None
        if kind == "choices":
            if not isinstance(spec, (list, tuple)) or not spec or not all(isinstance(c, str) for c in spec):
                raise GrammarError("choices must be a non-empty list of strings")
            return kind, tuple(spec)
        if kind == "regex":
            if not isinstance(spec, str):
                raise GrammarError("regex must be a string")
            return kind, spec
        return kind, None

    def _regex_for(self, key: tuple) -> str:
        with self._lock:
            rx = self._regex_cache.get(key)
        if rx is None:
            kind, spec = key
            if kind == "regex":
                check_user_regex(spec)
                rx = spec
            elif kind == "json_schema":
                rx = schema_to_regex(json.loads(spec))
            elif kind == "choices":
                rx = choices_regex(list(spec))
            else:
                rx = json_object_regex(JSON_OBJECT_DEPTH)
            with self._lock:
                self._regex_cache[key] = rx
                while len(self._regex_cache) > self.cache_size:
                    self._regex_cache.popitem(last=False)
        return rx

    def validate(self, kind: str, spec: Any) -> None:
        self._regex_for(self._key(kind, spec))

    # -- compile --------------------------------------------------------------------------------
    def _compile(self, key: tuple) -> CompiledGrammar:
        rx = self._regex_for(key)
        try:
            index = Index(rx, self._vocab)
        except (ValueError, RuntimeError, OverflowError) as e:
            msg = str(e)
            if len(msg) > 300:
                msg = msg[:150] + " ... " + msg[-150:]
            raise GrammarError(f"cannot compile the {key[0]} grammar: {msg}") from None
        return CompiledGrammar(index, self._fsm_eos, f"{key[0]} grammar", self.num_words)

    def _run(self, key: tuple, future: Future) -> None:
        try:
            result: CompiledGrammar | GrammarError = self._compile(key)
        except GrammarError as e:
            result = e
        except Exception as e:  # anything else is still this request's failure, not the scheduler's
            result = GrammarError(f"{key[0]} grammar: {type(e).__name__}: {e}")
        with self._lock:
            self._pending.pop(key, None)
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        if isinstance(result, GrammarError):
            future.set_exception(result)
        else:
            future.set_result(result)

    def request(self, kind: str, spec: Any) -> GrammarFuture:
        deadline = time.monotonic() + self.compile_timeout
        try:
            key = self._key(kind, spec)
        except GrammarError as e:
            future: Future = Future()
            future.set_exception(e)
            return GrammarFuture(self, kind, future, deadline)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                future = Future()
                if isinstance(cached, GrammarError):
                    future.set_exception(cached)
                else:
                    future.set_result(cached)
                return GrammarFuture(self, kind, future, deadline)
            future = self._pending.get(key)
            if future is None:
                future = self._pending[key] = Future()
                threading.Thread(target=self._run, args=(key, future), name="grammar-compile", daemon=True).start()
        return GrammarFuture(self, kind, future, deadline)

    def shutdown(self) -> None:
        """Forget cached grammars. Compile threads are daemons: they finish or die with the process."""
        with self._lock:
            self._cache.clear()
            self._regex_cache.clear()

    def _new_state(self, compiled: CompiledGrammar) -> GrammarState:
        return GrammarState(compiled, self.eos_token_ids, self.vocab_size, self.num_words, self.enable_jump_forward)
