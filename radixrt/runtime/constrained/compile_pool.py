"""Grammar work in worker processes, bounded in number, time and memory.

Turning a spec into a regex (schema normalisation) and the regex into an outlines-core index can
both blow up (a `oneOf` of many enums, `(a|b)*a(a|b){22}`, `a{100000000}`). In a thread such a
compile cannot be stopped; here it runs in a process that is killed at its deadline, so a timed-out
compile stops using CPU at once. Each worker runs at a lower CPU priority (decoding comes first),
under an address-space limit (a compile that needs more dies alone), and a bounded queue refuses
new work when too much is pending. A job's time limit counts from when a worker takes it, so a
queue of slow but valid compiles delays the last of them instead of refusing it (the wait is
bounded all the same: at most `max_pending` jobs, each stopped at its own limit). The limit is the
worker's CPU seconds on the job (Linux: /proc/<pid>/stat), not wall seconds: a niced worker starved
by the model's steps was killed at 10 wall seconds having done a fraction of that, and the request
then ran on the other backend without its budget steering (a required tool call could run out of
tokens only because the machine was busy). Wall time still ends a job at WALL_FACTOR times its
limit, whatever its CPU. Jobs:
  ("regex", key)  -> the regex (validation at the edge)
  ("index", key)  -> ([regex, distance tables], the outlines-core Index's binary form)
  ("stop_regex", patterns) -> each pattern's automaton build in CPU seconds, or the refusal that
                              ends the list (stop_regex.py's build_seconds; stop_regex_check.py)
"""

from __future__ import annotations

import collections
import os
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import Any, NamedTuple

from radixrt.runtime.constrained.compile_worker import (
    RESULT_FD_ENV,
    encode_token_map,
    index_result,
    read_result,
    write_frame,
)
from radixrt.runtime.constrained.regex_builder import GrammarError

POLL_S = 0.05
# a job's wall-clock bound, in multiples of its CPU limit: it ends a job that waits on the CPU (or
# on anything else) for that long
WALL_FACTOR = 10
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


WORKER_MODULE = "radixrt.runtime.constrained.compile_worker"


class _Job(NamedTuple):
    """A job a worker took."""

    future: Future
    wall_deadline: float  # monotonic seconds: ended here whatever its CPU
    key: tuple
    limit: float  # its CPU seconds (grammar_compile_timeout)
    cpu_deadline: float | None  # the worker's CPU seconds at the start + limit; None: no /proc


class _Worker:
    def __init__(self, args: tuple, module: str = WORKER_MODULE):
        # stderr (and stdout) inherited: a worker's crash report reaches the server log; its
        # results come on a pipe of their own (compile_worker.write_result: JSON and bytes)
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module],
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
                env={**os.environ, RESULT_FD_ENV: str(write_fd)},
                start_new_session=False,
            )
        finally:
            os.close(write_fd)
        self.results = os.fdopen(read_fd, "rb")
        write_frame(self.proc.stdin, args)
        self.job: _Job | None = None
        self.fresh = True  # no job taken yet: its first may also wait out the start-up

    def send(self, obj: Any) -> None:
        write_frame(self.proc.stdin, obj)

    def recv(self) -> tuple[str, Any, bytes]:
        return read_result(self.results)

    def fileno(self) -> int:
        return self.results.fileno()

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user + system) the worker has used so far; None where there is no /proc."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command's name
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
        except (OSError, ValueError, IndexError):
            return None

    def past_limit(self, now: float) -> bool:
        """Its job used its CPU limit (or, without /proc, its wall seconds), or WALL_FACTOR
        times that in wall seconds."""
        job = self.job
        if now >= job.wall_deadline:
            return True
        if job.cpu_deadline is None:
            return now >= job.wall_deadline - (WALL_FACTOR - 1) * job.limit
        used = self.cpu_seconds()
        return used is not None and used >= job.cpu_deadline

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        for f in (self.proc.stdin, self.results):
            try:
                f.close()
            except OSError:
                pass


class TransientGrammarError(GrammarError):
    """The pool could not judge the grammar (busy, a worker died, shut down, out of time under
    load): not a verdict on the grammar, so it is never cached."""


class CompileTimeout(TransientGrammarError):
    """The job ran past its time limit and its worker was killed."""


def _settle(future: Future, exc: Exception | None = None, result: Any = None) -> None:
    if not future.done():
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


class CompilePool:
    def __init__(
        self,
        num_workers: int = 1,
        token_map: dict | None = None,
        fsm_eos: int | None = None,
        memory_bytes: int = 2 << 30,
        max_pending: int = 64,
        module: str = WORKER_MODULE,
        setup: tuple | None = None,
        start_s: float = 0.0,
    ):
        """module, setup: another worker program and its first frame (xgrammar_compile.py), instead
        of compile_worker with (token_map, fsm_eos, memory_bytes). start_s: extra time the first job
        of a newly started worker gets, for a worker whose imports are slow (torch)."""
        self._args = (
            setup if setup is not None else (encode_token_map(token_map), fsm_eos, memory_bytes)
        )
        self._module, self.start_s = module, start_s
        self.num_workers = max(1, num_workers)
        self.max_pending = max_pending
        self._lock = threading.Lock()
        # (future, compile time limit, job, key)
        self._pending: collections.deque[tuple[Future, float, str, tuple]] = collections.deque()
        self._workers: list[_Worker] = []  # touched by the pool thread only (and shutdown)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.num_killed = 0  # workers killed at a deadline (or dead of their own accord)

    def settle_bound(self, timeout: float) -> float:
        """Seconds within which a job submitted now is settled when no job takes longer than
        `timeout`: the full queue ahead of it, then its own compile."""
        return (-(-self.max_pending // self.num_workers) + 1) * (
            WALL_FACTOR * timeout + self.start_s
        )

    def submit(self, job: str, key: tuple, timeout: float) -> Future:
        """Future of the job's result; GrammarError when it fails, TransientGrammarError when the
        pool could not judge it (past `timeout` once a worker took it, too much pending, a crashed
        worker, shut down)."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                future.set_exception(TransientGrammarError("the grammar compiler is shut down"))
                return future
            if len(self._pending) >= self.max_pending:
                future.set_exception(
                    TransientGrammarError(
                        f"too many grammars are compiling ({self.max_pending} waiting); "
                        "try again later"
                    )
                )
                return future
            self._pending.append((future, timeout, job, key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="grammar-pool", daemon=True)
                self._thread.start()
        return future

    def _run(self) -> None:
        """Never dies while the pool is open: whatever goes wrong fails the jobs it touched, not the
        thread."""
        while not self._closed:
            try:
                self._step()
            except Exception as e:  # a pipe closed under us, a worker that cannot start, ...
                if self._closed:
                    return
                for w in list(self._workers):
                    if w.job is not None:
                        _settle(
                            w.job.future, TransientGrammarError(f"the grammar compiler failed: {e}")
                        )
                    w.kill()
                self._workers = []
                time.sleep(POLL_S)

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
            if w.job is not None and w.past_limit(now):
                self._fail(
                    w,
                    f"compiling the {w.job.key[0]} grammar took longer than {w.job.limit:g} s of "
                    "CPU (grammar_compile_timeout); the compile was stopped",
                    CompileTimeout,
                )

    def _next_job(self) -> tuple[Future, float, str, tuple] | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    def _dispatch(self) -> None:
        while self._pending:
            self._workers = [w for w in self._workers if w.job is not None or w.proc.poll() is None]
            idle = next((w for w in self._workers if w.job is None), None)
            if idle is None and len(self._workers) < self.num_workers:
                # outside the lock: submit() never waits for a start-up
                idle = _Worker(self._args, self._module)
                self._workers.append(idle)
            if idle is None:
                return
            item = self._next_job()
            if item is None:
                return
            future, timeout, job, key = item
            grace = self.start_s if idle.fresh else 0.0  # a new worker's imports use CPU too
            idle.fresh = False
            used = idle.cpu_seconds()
            cpu_deadline = None if used is None else used + timeout + grace
            wall_deadline = time.monotonic() + WALL_FACTOR * timeout + grace
            idle.job = _Job(future, wall_deadline, key, timeout, cpu_deadline)
            try:
                idle.send((job, key))
            except (OSError, ValueError):
                self._fail(idle, f"the {key[0]} grammar's worker was gone")

    def _collect(self, worker: _Worker) -> None:
        future, key = worker.job.future, worker.job.key
        try:
            status, value, blob = worker.recv()
        except (EOFError, OSError, ValueError, struct.error):
            self._fail(
                worker, f"compiling the {key[0]} grammar crashed its worker (out of memory?)"
            )
            return
        worker.job = None
        if status == "ok":
            _settle(future, result=index_result(value, blob) if blob else value)
        else:
            _settle(future, GrammarError(value))  # the worker's verdict on the grammar itself

    def _fail(self, worker: _Worker, message: str, error: type = TransientGrammarError) -> None:
        """Kill the worker (its CPU and memory come back at once) and fail its job; a replacement
        starts at once, so the next job need not wait for it."""
        future = worker.job.future
        worker.kill()
        self.num_killed += 1
        self._workers.remove(worker)
        _settle(future, error(message))
        if not self._closed:
            self._workers.append(_Worker(self._args, self._module))

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending), collections.deque()
        workers, self._workers = self._workers, []
        for future, *_ in pending:
            _settle(future, TransientGrammarError("the grammar compiler is shut down"))
        for w in workers:
            job = w.job
            if job is not None:
                _settle(job.future, TransientGrammarError("the grammar compiler is shut down"))
            w.kill()
