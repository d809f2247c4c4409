"""The edge's check of a request's stop_regex patterns, without building an automaton in the
server's own process (#41): `[ab]*a[ab]{26}` would build 2**27 states on the event loop, stopping
/health, every stream and the watchdog until the OOM killer came.

Each request's patterns not seen before are built in a compile worker (compile_pool.py: a process
killed at its deadline, under an address-space limit, behind a bounded queue, at a lower CPU
priority), after stop_regex.py's cheap check refused what it can refuse at once. A request is
accepted only when all its automata were built, each within MAX_STATES, in at most BUILD_BUDGET_S
of CPU together. That budget is also what bounds the scheduler's and the detokenizer process's
rebuild of the same automata (StopRegexSearch, on their loops; once per pattern in each, cached),
and the Engine's own: the built automaton is not shipped, the budget makes rebuilding it cheap.
Verdicts on a pattern are cached here; a build stopped at the deadline is not (under load a
worker at low priority can be slow), nor is a busy queue.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from radixrt.runtime.constrained.compile_pool import CompilePool, CompileTimeout

BUILD_BUDGET_S = 1.0  # CPU seconds one request's automata may take to build, all together
# wall seconds before the worker is killed: the budget, a fresh worker's start (~0.6 s) and room
# for a worker at low priority on a busy machine
KILL_AFTER_S = 3.0
CACHE_SIZE = 1024  # patterns whose verdict is kept


class StopRegexChecker:
    def __init__(self, memory_mb: int = 2048, max_pending: int = 64):
        # one worker: the automata are small once bounded; starts on the first pattern
        self._pool = CompilePool(1, None, None, memory_mb << 20, max_pending)
        self._lock = threading.Lock()
        # pattern -> CPU seconds of its build (accepted alone) or why it was refused
        self._verdicts: collections.OrderedDict[str, float | str] = collections.OrderedDict()

    def submit(self, patterns: list[str]) -> Future:
        """A future settled with None when the patterns can run together, or with a ValueError
        naming stop_regex. Call after SamplingParams' own checks (check_stop_regex)."""
        future: Future = Future()
        patterns = list(dict.fromkeys(patterns))
        with self._lock:
            known = {p: self._verdicts[p] for p in patterns if p in self._verdicts}
        todo = tuple(p for p in patterns if p not in known)
        if not todo:
            self._settle(future, patterns, known)
            return future
        job = self._pool.submit("stop_regex", todo, KILL_AFTER_S)
        job.add_done_callback(lambda j: self._done(future, patterns, known, todo, j))
        return future

    def check(self, patterns: list[str]) -> None:
        """submit(), waited on (the Engine: no event loop to keep free); ValueError when refused."""
        if not patterns:
            return
        try:
            self.submit(patterns).result(self._pool.settle_bound(KILL_AFTER_S) + KILL_AFTER_S)
        except FutureTimeout:
            raise ValueError(
                f"sampling parameter stop_regex {patterns!r} could not be checked in time"
            ) from None

    def _done(
        self,
        future: Future,
        patterns: list[str],
        known: dict[str, float | str],
        todo: tuple[str, ...],
        job: Future,
    ) -> None:
        try:
            built = dict(zip(todo, job.result()))
        except CompileTimeout:
            future.set_exception(
                ValueError(
                    f"sampling parameter stop_regex {list(todo)!r} is too complex: its automaton "
                    f"was not built within {KILL_AFTER_S:g} s (the build was stopped)"
                )
            )
            return
        except Exception as e:  # a busy queue, a crashed worker, shut down
            future.set_exception(
                ValueError(
                    f"sampling parameter stop_regex {list(todo)!r} could not be checked: {e}"
                )
            )
            return
        with self._lock:
            for p, verdict in built.items():
                self._verdicts[p] = verdict
                self._verdicts.move_to_end(p)
            while len(self._verdicts) > CACHE_SIZE:
                self._verdicts.popitem(last=False)
        self._settle(future, patterns, {**known, **built})

    @staticmethod
    def _settle(future: Future, patterns: list[str], verdicts: dict[str, float | str]) -> None:
        refusal = next((v for v in verdicts.values() if isinstance(v, str)), None)
        seconds = sum(v for v in verdicts.values() if not isinstance(v, str))
        if refusal is None and seconds > BUILD_BUDGET_S:
            refusal = (
                f"sampling parameter stop_regex {patterns!r} is too complex: its automata take "
                f"{seconds:.2f} s to build, at most {BUILD_BUDGET_S:g} s"
            )
        if refusal is None:
            future.set_result(None)
        else:
            future.set_exception(ValueError(refusal))

    def shutdown(self) -> None:
        self._pool.shutdown()
