"""`--grammar-backend auto` (the default): llguidance first, outlines-core for what llguidance
refuses, and outlines' DFA as a shadow that budget-steers the requests llguidance serves.

Why this order (benchmarks/bench_grammar.py, JSONSchemaBench sample): llguidance compiles in
milliseconds and passes more schemas; outlines passes a different set (`not`, `oneOf` it proves
disjoint), so a schema llguidance refuses goes to outlines, and the union passes more than either.
Both are sound, so the union is.

Budget steering needs the fewest tokens to finish from each state (budget.py), which only the DFA
gives. So a regex-shaped constraint served by llguidance also gets its outlines grammar compiled in
the background (the niced, bounded compile pool; cached), and the request waits for it as for its
grammar (a shadow that arrived after the first tokens could find the budget already past the
shortest completion); it then follows along. Near the end of the budget the pick is llguidance's
mask AND the shadow's steered tokens. If the model leaves the shadow's language (outlines is
stricter: declared key order, no undeclared keys), the shadow is dropped and the request goes on
unsteered; an intersection that comes out empty keeps llguidance's mask. The choice of backend is
remembered per grammar, so a later request does not ask llguidance again. A context-free grammar
(ebnf) is llguidance's alone (no fallback); its shadow is the DFA of the grammar's nesting-bounded
regular subset (cfg_regex.py).
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from radixrt.runtime.constrained.cfg_regex import cfg_regex
from radixrt.runtime.constrained.compile_pool import TransientGrammarError
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import CFG_KINDS, grammar_key

REMEMBERED = 1024  # grammars known to need the second backend


class FallbackBackend:
    name = "auto"

    def __init__(self, primary: Any, secondary: Any, shadow: bool = False, fallback: bool = True):
        """shadow: the secondary (outlines) also steers what the primary (llguidance) serves.
        fallback=False (the configured --grammar-backend llguidance): the secondary only steers; the
        primary's refusal stands."""
        self.primary, self.secondary, self.shadow, self.fallback = (
            primary,
            secondary,
            shadow,
            fallback,
        )
        if not fallback:
            self.name = primary.name
        self._subset_pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="radixrt-cfg-subset"
        )
        self._lock = threading.Lock()
        self._second: collections.OrderedDict[tuple, None] = collections.OrderedDict()

    def _known_second(self, kind: str, spec: Any) -> bool:
        if not self.fallback:
            return False
        try:
            key = grammar_key(kind, spec)
        except GrammarError:
            return False
        with self._lock:
            if key in self._second:
                self._second.move_to_end(key)
                return True
        return False

    def remember_second(self, kind: str, spec: Any) -> None:
        try:
            key = grammar_key(kind, spec)
        except GrammarError:
            return  # a malformed spec: the second backend will say so
        with self._lock:
            self._second[key] = None
            while len(self._second) > REMEMBERED:
                self._second.popitem(last=False)

    def validate(self, kind: str, spec: Any) -> None:
        # only llguidance enforces a context-free grammar
        if kind in CFG_KINDS or not self.fallback:
            return self.primary.validate(kind, spec)
        if self._known_second(kind, spec):
            return self.secondary.validate(kind, spec)
        try:
            return self.primary.validate(kind, spec)
        except GrammarError as first:
            try:
                self.secondary.validate(kind, spec)
            except GrammarError as second:
                raise GrammarError(f"{first} (and {self.secondary.name}: {second})") from None

    def request(self, kind: str, spec: Any) -> "FallbackFuture":
        if self._known_second(kind, spec):
            return FallbackFuture(self, kind, spec, None, self.secondary.request(kind, spec))
        return FallbackFuture(self, kind, spec, self.primary.request(kind, spec), None)

    def shadow_for(self, kind: str, spec: Any) -> Any:
        """The secondary's compile of the same constraint, to steer by (None when it has no DFA
        form); for a context-free grammar, of its nesting-bounded regular subset (cfg_regex.py)."""
        if not self.shadow:
            return None
        if kind in CFG_KINDS:  # lark reads the grammar on a worker thread, not the scheduler's
            return SubsetShadowFuture(self.secondary, self._subset_pool.submit(cfg_regex, spec))
        return self.secondary.request(kind, spec)

    @property
    def cached_bytes(self) -> int:
        return self.primary.cached_bytes + self.secondary.cached_bytes

    def shutdown(self) -> None:
        self._subset_pool.shutdown(wait=False, cancel_futures=True)
        self.primary.shutdown()
        self.secondary.shutdown()


class FallbackFuture:
    """The primary's compile; on its failure, the secondary's. Polled by the scheduler (done, then
    result)."""

    def __init__(self, backend: FallbackBackend, kind: str, spec: Any, first: Any, second: Any):
        self._backend, self._kind, self._spec = backend, kind, spec
        self._first, self._second = first, second
        self._state: Any = None
        self._shadow: Any = None  # the steering shadow's compile, waited for as part of the grammar
        self._first_error: GrammarError | None = None

    def done(self) -> bool:
        """Ready once the grammar AND its steering shadow are (or the shadow failed: then
        unsteered). A request never decodes before its steering is known: a shadow that arrived late
        found the budget already spent past the shortest completion (the budget-valid guarantee held
        only when the shadow's compile was quick)."""
        if self._state is not None:
            return self._shadow is None or self._shadow.done()
        if self._second is None:
            if not self._first.done():
                return False
            try:
                self._state = self._first.result()
            except Exception as e:  # noqa: BLE001
                # whatever the first backend raised, the second may serve it
                self._first_error = (
                    e if isinstance(e, GrammarError) else GrammarError(f"{type(e).__name__}: {e}")
                )
                # the primary's verdict stands
                if self._kind in CFG_KINDS or not self._backend.fallback:
                    return True
                # a verdict on the grammar, not a bad moment
                if not isinstance(e, TransientGrammarError):
                    self._backend.remember_second(self._kind, self._spec)
                self._second = self._backend.secondary.request(self._kind, self._spec)
                return self._second.done()
            self._shadow = self._backend.shadow_for(self._kind, self._spec)
            if self._shadow is not None:
                # a grammar's shadow is only its nesting-bounded part: the output is kept inside it
                # (confined), since output that nests deeper could no longer be steered to a valid
                # close
                self._state.follow(self._shadow, confine=self._kind in CFG_KINDS)
            return self._shadow is None or self._shadow.done()
        return self._second.done()

    def result(self) -> Any:
        assert self.done(), "FallbackFuture.result() called before done()"
        if self._state is not None:
            return self._state
        if self._second is None:
            raise self._first_error
        try:
            return self._second.result()
        except GrammarError as e:
            if self._first_error is None:
                raise
            raise GrammarError(
                f"{self._first_error} (and {self._backend.secondary.name}: {e})"
            ) from None


class SubsetShadowFuture:
    """The outlines compile of a grammar's regular subset: done once the regex is built (cfg_regex,
    on a worker thread) and outlines has compiled it; a grammar with no regular subset gives
    GrammarError (unsteered)."""

    def __init__(self, secondary: Any, regex: Future):
        self._secondary, self._regex, self._compile = secondary, regex, None

    def done(self) -> bool:
        if self._compile is None:
            if not self._regex.done():
                return False
            if self._regex.exception() is not None:
                return True
            self._compile = self._secondary.request("regex", self._regex.result())
        return self._compile.done()

    def result(self) -> Any:
        if self._compile is None:
            return self._regex.result()  # raises the GrammarError
        return self._compile.result()


class Shadow:
    """An outlines GrammarState that follows a request served by llguidance, for budget steering
    only. Before its compile arrives the tokens are kept, and replayed on it when it does."""

    def __init__(self, future: Any):
        self._future = future
        self._pending: list[int] | None = []
        self.state: Any = None

    def accept(self, token_id: int) -> None:
        if self._pending is not None:
            self._pending.append(token_id)
        elif self.state is not None:
            try:
                self.state.accept(token_id)
            except GrammarError:  # the model left the stricter DFA language: no more steering
                self.state = None

    def fork(self, tokens: list[int]) -> "Shadow":
        """The same shadow for a forked request: tokens still pending are copied, a compiled state
        is forked (tokens: every token accepted so far)."""
        twin = Shadow(self._future)
        if self._pending is not None:
            twin._pending = list(self._pending)
        else:
            twin._pending = None
            twin.state = None if self.state is None else self.state.fork(tokens)
        return twin

    def current(self) -> Any:
        """The shadow state, caught up with every accepted token, or None (not compiled yet, or
        gone)."""
        if self._pending is not None and self._future.done():
            tokens, self._pending = self._pending, None
            try:
                self.state = self._future.result()
            except GrammarError:
                return None
            for t in tokens:
                self.accept(t)
        return self.state


class IntersectMask:
    """llguidance's mask AND the shadow's steered tokens (llguidance's alone if that leaves
    nothing)."""

    ended = False

    def __init__(self, served: Any, steered: Any):
        self.served, self.steered = served, steered
        self.num_words = served.num_words
        self.eos_token_ids = served.eos_token_ids

    def write_bits(self, words: torch.Tensor) -> None:
        self.served.write_bits(words)
        steer = torch.zeros(max(self.steered.num_words, words.numel()), dtype=torch.int32)
        self.steered.write_bits(steer)
        steer_np = steer.numpy()[: words.numel()]
        both = words.numpy() & steer_np
        # steered to EOS alone (accepting, no token fits): then EOS is the only pick, not
        # llguidance's mask
        only_eos = not steer_np.any() and self.steered.eos_open() and self.served.eos_open()
        if both.any() or only_eos:
            np.copyto(words.numpy(), both)

    def eos_open(self) -> bool:
        return self.served.eos_open()
