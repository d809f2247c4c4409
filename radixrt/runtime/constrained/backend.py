"""Constrained decoding: regex / JSON schema / choices -> outlines-core index -> token masks.

Flow: `validate` (synchronous, at the edge) turns the spec into a regex and raises GrammarError
for anything we cannot enforce. `request` returns a GrammarFuture at once; a daemon thread
builds the outlines-core Index (Rust; it releases the GIL, so decoding of other requests goes
on). Compiled indexes are shared through a bounded LRU keyed by (kind, spec); a compile that
outlives `compile_timeout` fails its request with GrammarError (the thread may finish later and
fill the cache; a daemon thread never blocks interpreter exit).

Jump-forward drafts the text the grammar forces (`{"` -> `name"`), tokenized canonically, and
the model verifies the draft in the same forward as the request's next token (grammar_draft.py):
output is exactly what decoding token by token gives, greedy or sampled. grammar_state.py holds
the per-request state and the batched masks.

Known limit of outlines-core 0.2.14: its index drops a token whose last-but-one byte ends a
match while the token itself does not (regex-automata reports matches one byte late), e.g.
"." right after a final "0" in `0([.][0-9]+)?`. Only tokens crossing an accepting position of
the whole regex are affected (never inside a JSON object, whose one accepting position is the
closing brace); the language stays sound, a few tokenizations of it are not offered.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from concurrent.futures import Future
from typing import Any

from outlines_core import Index, Vocabulary

from radixrt.runtime.constrained.pattern import check_user_regex
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.draft import Drafter, VocabBytes
from radixrt.runtime.constrained.state import CompiledGrammar, GrammarState, fill_masks
from radixrt.runtime.constrained.vocab import token_bytes_map
from radixrt.runtime.constrained.json_schema.to_regex import choices_regex, json_object_regex, schema_to_regex

__all__ = ["GrammarError", "GrammarBackend", "GrammarFuture", "GrammarState", "fill_masks", "KINDS"]
KINDS = ("regex", "json_schema", "choices", "json_object")
JSON_OBJECT_DEPTH = 2  # nesting levels of a response_format json_object (outer object included)


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
        self.drafter = Drafter(tokenizer, VocabBytes(token_map, max_id + 1)) if enable_jump_forward else None
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
        return GrammarState(compiled, self.eos_token_ids, self.vocab_size, self.num_words, self.drafter)
