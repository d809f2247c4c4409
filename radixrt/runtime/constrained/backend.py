"""Constrained decoding: regex / JSON schema / choices -> outlines-core index -> token masks.

Flow: `validate` (at the edge) turns the spec into a regex and raises GrammarError for anything we
cannot enforce. `request` returns a GrammarFuture at once. Both run in worker processes
(compile_pool.py): bounded in number, killed at `compile_timeout` (a runaway compile stops using
CPU), under a memory limit, at a lower CPU priority than decoding. Compiled indexes are shared
through an LRU keyed by (kind, spec), bounded in entries and in bytes.

Jump-forward drafts the text the grammar forces (`{"` -> `name"`), tokenized canonically, and
the model verifies the draft in the same forward as the request's next token (draft.py):
output is exactly what decoding token by token gives, greedy or sampled. state.py holds
the per-request state and the batched masks.

Known limit of outlines-core 0.2.14: its index drops a token whose last-but-one byte ends a
match while the token itself does not (regex-automata reports matches one byte late), e.g.
"." right after a final "0" in `0([.][0-9]+)?`. Only tokens crossing an accepting position of
the whole regex are affected (never inside a JSON object, whose one accepting position is the
closing brace); the language stays sound, a few tokenizations of it are not offered.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from outlines_core import Index, Vocabulary

from radixrt.runtime.constrained.budget import completion_distances
from radixrt.runtime.constrained.compile_pool import CompilePool, TransientGrammarError
from radixrt.runtime.constrained.compiled_cache import CompiledCache
from radixrt.runtime.constrained.draft import Drafter, VocabBytes
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import KINDS, spec_regex
from radixrt.runtime.constrained.state import CompiledGrammar, GrammarState, fill_masks
from radixrt.runtime.constrained.vocab import token_bytes_map

START_MARGIN_S = 30.0  # a compile worker's start-up, on top of the pool's own bound

__all__ = ["GrammarError", "GrammarBackend", "GrammarFuture", "GrammarState", "fill_masks", "KINDS"]


class GrammarFuture:
    """A grammar being compiled. The pool settles every job within its bound (queue wait plus the
    compile's own time limit); the deadline here is only a safety net past that bound."""

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
            raise TransientGrammarError(
                f"the {self._kind} grammar was not compiled in time; try again later"
            )
        exc = self._future.exception()
        if exc is not None:
            raise (
                exc
                if isinstance(exc, GrammarError)
                else GrammarError(f"{self._kind} grammar: {exc}")
            )
        return self._backend.new_state(self._future.result())


class GrammarBackend:
    name = "outlines"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: list[int],
        cache_size: int = 256,
        compile_timeout: float = 10.0,
        enable_jump_forward: bool = True,
        compile_workers: int = 1,
        compile_memory_mb: int = 2048,
        cache_bytes: int = 512 << 20,
        index: bool = True,
    ):
        """index False: only validate (the edge needs no vocabulary in its workers)."""
        if cache_size < 1 or compile_timeout <= 0:
            raise ValueError("cache_size must be >= 1 and compile_timeout > 0")
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted({int(e) for e in eos_token_ids})
        self.compile_timeout = compile_timeout
        token_map = token_bytes_map(tokenizer, vocab_size)
        for e in self.eos_token_ids:  # EOS is the grammar's to allow, never a spelled token
            for ids in token_map.values():
                if e in ids:
                    ids.remove(e)
        token_map = {b: ids for b, ids in token_map.items() if ids}
        # outlines wants one EOS id outside the map; with none given use an id past the logits
        self._fsm_eos = self.eos_token_ids[0] if self.eos_token_ids else vocab_size
        # validation needs none
        self._vocab = Vocabulary(self._fsm_eos, token_map) if index else None
        max_id = max([self._fsm_eos, vocab_size - 1] + [max(ids) for ids in token_map.values()])
        self.num_words = (max_id + 1 + 31) // 32
        self.drafter = (
            Drafter(tokenizer, VocabBytes(token_map, max_id + 1)) if enable_jump_forward else None
        )
        self.pool = CompilePool(
            compile_workers, token_map if index else None, self._fsm_eos, compile_memory_mb << 20
        )
        self.compiled = CompiledCache(
            self.pool,
            cache_size,
            cache_bytes,
            compile_timeout,
            self._settle_bound,
            ("regex", "index"),
            self._read,
        )

    def validate(self, kind: str, spec: Any) -> None:
        """GrammarError unless the spec can be enforced; blocks the caller (call it off an event
        loop)."""
        self.compiled.validate(kind, spec)

    def _read(self, key: tuple, job_result: Any) -> tuple[CompiledGrammar, int]:
        """A finished compile job (compile_worker.index_result: the Index in its own binary form,
        never a pickle): the index and its distance tables."""
        from outlines_core import Index

        _, blob, distances = job_result
        index = Index.from_binary(blob)
        grammar = CompiledGrammar(
            index, self._fsm_eos, f"{key[0]} grammar", self.num_words, distances
        )
        return grammar, len(blob)

    def _settle_bound(self) -> float:
        # the pool settles every job within its bound; the margin covers a worker's start
        return self.pool.settle_bound(self.compile_timeout) + START_MARGIN_S

    def request(self, kind: str, spec: Any) -> GrammarFuture:
        return GrammarFuture(self, kind, *self.compiled.request(kind, spec))

    def compile_in_process(self, key: tuple) -> CompiledGrammar:
        """Compile here, unbounded: for benchmarks that time it in a process of their own."""
        try:
            index = Index(spec_regex(key), self._vocab)
        except (ValueError, RuntimeError, OverflowError) as e:
            raise GrammarError(f"cannot compile the {key[0]} grammar: {str(e)[:300]}") from None
        return CompiledGrammar(
            index, self._fsm_eos, f"{key[0]} grammar", self.num_words, completion_distances(index)
        )

    @property
    def cached_bytes(self) -> int:
        return self.compiled.cached_bytes

    def shutdown(self) -> None:
        """Forget cached grammars and stop the compile workers."""
        self.compiled.clear()
        self.pool.shutdown()

    def new_state(self, compiled: CompiledGrammar) -> GrammarState:
        return GrammarState(
            compiled, self.eos_token_ids, self.vocab_size, self.num_words, self.drafter
        )
