"""Grammar work in worker processes, bounded in number, time and memory.

Turning a spec into a regex (schema normalisation) and the regex into an outlines-core index can
both blow up (a `oneOf` of many enums, `(a|b)*a(a|b){22}`, `a{100000000}`). In a thread such a
compile cannot be stopped; here it runs in a process that is killed at its deadline, so a timed-out
compile stops using CPU at once. Each worker runs at a lower CPU priority (decoding comes first),
under an address-space limit (a compile that needs more dies alone), and a bounded queue refuses
new work when too much is pending. Jobs:
  ("regex", key)  -> the regex (validation at the edge)
  ("index", key)  -> (regex, pickled outlines-core Index) for the scheduler's grammar
"""
from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import Any

from radixrt.runtime.constrained.compile_worker import read_frame, write_frame
from radixrt.runtime.constrained.regex_builder import GrammarError

POLL_S = 0.05


class _Worker:
    def __init__(self, args: tuple):
        # stderr inherited: a worker's crash report reaches the server log
        self.proc = subprocess.Popen([sys.executable, "-m", "radixrt.runtime.constrained.compile_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=False)
        write_frame(self.proc.stdin, args)
        self.job: tuple[Future, float, tuple] | None = None  # (future, deadline, key)

    def send(self, obj: Any) -> None:
        write_frame(self.proc.stdin, obj)

    def recv(self) -> Any:
        return read_frame(self.proc.stdout)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class CompilePool:
    def __init__(self, num_workers: int = 1, token_map: dict | None = None, fsm_eos: int | None = None,
                 memory_bytes: int = 2 << 30, max_pending: int = 64):
        self._args = (token_map, fsm_eos, memory_bytes)
        self.num_workers = max(1, num_workers)
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: collections.deque[tuple[Future, float, str, tuple]] = collections.deque()
        self._workers: list[_Worker] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.num_killed = 0  # workers killed at a deadline (or dead of their own accord)

    def submit(self, job: str, key: tuple, timeout: float) -> Future:
        """Future of the job's result; GrammarError when it fails, times out, or too much is pending."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                future.set_exception(GrammarError("the grammar compiler is shut down"))
                return future
            if len(self._pending) >= self.max_pending:
                future.set_exception(GrammarError(f"too many grammars are compiling ({self.max_pending} waiting); "
                                                  f"try again later"))
                return future
            self._pending.append((future, time.monotonic() + timeout, job, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="grammar-pool", daemon=True)
                self._thread.start()
        return future

    def _run(self) -> None:
        while not self._closed:
            try:
                self._step()
            except (OSError, ValueError):  # a worker's pipe closed under us by shutdown()
                if not self._closed:
                    raise

    def _step(self) -> None:
        self._dispatch()
        busy = [w for w in self._workers if w.job is not None]
        if not busy:
            time.sleep(POLL_S)
            return
        for worker in wait(busy, timeout=POLL_S):
            self._collect(worker)
        now = time.monotonic()
        for w in busy:
            if w.job is not None and now >= w.job[1]:
                self._fail(w, f"compiling the {w.job[2][0]} grammar took longer than its time limit "
                              f"(grammar_compile_timeout); the compile was stopped")

    def _dispatch(self) -> None:
        with self._lock:
            while self._pending:
                idle = next((w for w in self._workers if w.job is None), None)
                if idle is None and len(self._workers) < self.num_workers:
                    idle = _Worker(self._args)
                    self._workers.append(idle)
                if idle is None:
                    return
                future, deadline, job, key = self._pending.popleft()
                if time.monotonic() >= deadline:
                    future.set_exception(GrammarError(f"the {key[0]} grammar waited past its time limit to compile"))
                    continue
                idle.job = (future, deadline, key)
                idle.send((job, key))

    def _collect(self, worker: _Worker) -> None:
        future, _, key = worker.job
        try:
            status, value = worker.recv()
        except (EOFError, OSError, ValueError):
            self._fail(worker, f"compiling the {key[0]} grammar crashed its worker (out of memory?)")
            return
        worker.job = None
        if status == "ok":
            future.set_result(value)
        else:
            future.set_exception(GrammarError(value))

    def _fail(self, worker: _Worker, message: str) -> None:
        """Kill the worker (its CPU and memory come back at once) and fail its job; a new worker
        replaces it on the next dispatch."""
        future = worker.job[0]
        worker.kill()
        self.num_killed += 1
        with self._lock:
            self._workers.remove(worker)
            self._workers.append(_Worker(self._args))  # starts now: the next job need not wait for it
        future.set_exception(GrammarError(message))

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending), collections.deque()
            workers, self._workers = self._workers, []
        for future, *_ in pending:
            future.set_exception(GrammarError("the grammar compiler is shut down"))
        for w in workers:
            if w.job is not None:
                w.job[0].set_exception(GrammarError("the grammar compiler is shut down"))
            w.kill()
