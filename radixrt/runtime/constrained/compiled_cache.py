"""What the two backends that compile in the worker pool share (backend.py's outlines-core and
xgrammar_backend.py's): validation through the pool, one job per grammar in flight, and the
compiled grammars in an LRU bounded in entries and bytes. Each backend says which pool job
validates and which compiles, and how a finished job's result becomes its compiled grammar (and
its size).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from radixrt.runtime.constrained.compile_pool import TransientGrammarError
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import grammar_key


class CompiledCache:
    def __init__(
        self,
        pool: Any,  # compile_pool.CompilePool
        cache_size: int,
        cache_bytes: int,
        compile_timeout: float,
        settle_bound: Callable[[], float],  # the longest a pool job can take to settle
        jobs: tuple[str, str],  # the pool's job names: (validate, compile)
        read: Callable[[tuple, Any], tuple[Any, int]],  # (key, job result) -> (grammar, bytes)
    ):
        if cache_size < 1 or compile_timeout <= 0:
            raise ValueError("cache_size must be >= 1 and compile_timeout > 0")
        self.pool, self.cache_size, self.cache_bytes = pool, cache_size, cache_bytes
        self.compile_timeout, self.settle_bound = compile_timeout, settle_bound
        self.jobs, self.read = jobs, read
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple, tuple[Any, int]] = collections.OrderedDict()
        self.cached_bytes = 0
        self._pending: dict[tuple, Future] = {}
        self._valid: collections.OrderedDict[tuple, None] = collections.OrderedDict()  # checked

    def validate(self, kind: str, spec: Any) -> None:
        """GrammarError unless the spec can be enforced; blocks the caller for at most the pool's
        bound (call it off an event loop)."""
        key = grammar_key(kind, spec)
        with self._lock:
            if key in self._valid or key in self._cache:
                return
        try:
            self.pool.submit(self.jobs[0], key, self.compile_timeout).result(
                timeout=self.settle_bound()
            )
        except FutureTimeout:
            raise TransientGrammarError(
                f"validating the {kind} grammar did not finish in time"
            ) from None
        with self._lock:
            self._valid[key] = None
            while len(self._valid) > self.cache_size:
                self._valid.popitem(last=False)

    def request(self, kind: str, spec: Any) -> tuple[Future, float]:
        """(a future of the compiled grammar or its GrammarError, the deadline past which it is
        overdue): cached, already in flight, or submitted now."""
        deadline = time.monotonic() + self.settle_bound()
        future: Future = Future()
        try:
            key = grammar_key(kind, spec)
        except GrammarError as e:
            future.set_exception(e)
            return future, deadline
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                if isinstance(cached[0], GrammarError):
                    future.set_exception(cached[0])
                else:
                    future.set_result(cached[0])
                return future, deadline
            pending = self._pending.get(key)
            if pending is not None:
                return pending, deadline
            self._pending[key] = future
        job = self.pool.submit(self.jobs[1], key, self.compile_timeout)
        job.add_done_callback(lambda j: self._done(key, future, j))
        return future, deadline

    def _done(self, key: tuple, future: Future, job: Future) -> None:
        """A pool job finished (on the pool's thread): read it, cache it, resolve the future."""
        try:
            result, size = self.read(key, job.result())
        except GrammarError as e:
            result, size = e, 0
        except Exception as e:  # anything else is still this request's failure, not the scheduler's
            result, size = GrammarError(f"{key[0]} grammar: {type(e).__name__}: {e}"), 0
        with self._lock:
            self._pending.pop(key, None)
            # a verdict on the grammar is cached; "could not judge it now" (busy, timed out under
            # load, a crashed worker) is not, or one bad moment would refuse that grammar until
            # evicted
            if size <= self.cache_bytes and not isinstance(result, TransientGrammarError):
                self._cache[key] = (result, size)
                self.cached_bytes += size
            while self._cache and (
                len(self._cache) > self.cache_size or self.cached_bytes > self.cache_bytes
            ):
                self.cached_bytes -= self._cache.popitem(last=False)[1][1]
        if isinstance(result, GrammarError):
            future.set_exception(result)
        else:
            future.set_result(result)

    def clear(self) -> None:
        """Forget every cached grammar and validation."""
        with self._lock:
            self._cache.clear()
            self.cached_bytes = 0
            self._valid.clear()
