"""Grammar compiles in worker processes: a compile past its deadline is killed (its CPU stops at once),
one past its memory limit dies alone, a full queue refuses, the time
limit counts from the start of the compile (not the wait) and in the worker's CPU seconds (not the
seconds it waited for a CPU), and the pool keeps working after each."""

import os
import signal
import time

import psutil
import pytest
from outlines_core import Vocabulary

from radixrt.runtime.constrained.compile_pool import CompilePool
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import MAX_SCHEMA_DEPTH, grammar_key

TOKENS = {"a": [1], "b": [2], "ab": [3], "{": [4], "}": [5], '"': [6], "1": [7], ":": [8]}
EXPLOSIVE = "(a|b)*a(a|b){22}"  # its DFA has 2^23 states


@pytest.fixture
def pool():
    p = CompilePool(1, TOKENS, 0, memory_bytes=512 << 20, max_pending=3)
    yield p
    p.shutdown()


def worker_pids(p: CompilePool) -> list[int]:
    return [w.proc.pid for w in p._workers]  # noqa: SLF001 (the test inspects the pool it checks)


def test_a_good_grammar_compiles_to_a_working_index(pool):
    from outlines_core import Index

    rx, blob, (dist, max_next) = pool.submit("index", grammar_key("regex", "(a|b)+"), 30).result()
    index = Index.from_binary(blob)  # its own binary form: a worker's result is never a pickle
    # one token ends the match; steering's table came along
    assert dist[index.get_initial_state()] == 1
    state = index.get_next_state(index.get_initial_state(), 1)
    assert rx == "(a|b)+" and index.is_final_state(state)
    assert index.get_next_state(index.get_initial_state(), 4) is None  # "{" is not allowed
    assert isinstance(Vocabulary(0, TOKENS), Vocabulary)


def test_a_compile_past_its_deadline_is_killed_and_the_pool_recovers(pool):
    from radixrt.runtime.constrained.compile_pool import WALL_FACTOR

    pool.submit("regex", grammar_key("regex", "a"), 30).result()  # a live worker
    (pid,) = worker_pids(pool)
    worker = psutil.Process(pid)
    cpu_before = sum(worker.cpu_times()[:2])
    started = time.monotonic()
    job = pool.submit("index", grammar_key("regex", EXPLOSIVE), 2)
    cpu_used = 0.0
    while not job.done():  # the worker's CPU on the job, sampled until it is stopped
        try:
            cpu_used = sum(worker.cpu_times()[:2]) - cpu_before
        except psutil.Error:  # gone: killed
            break
        time.sleep(0.02)
    with pytest.raises(GrammarError, match="longer than 2 s"):
        job.result()
    # stopped once it had used its 2 s of CPU (a poll and a kill later), however long it waited
    # for a CPU on a busy machine; the wall bound holds whatever the load
    assert cpu_used < 2 + 0.5
    assert time.monotonic() - started < 2 * WALL_FACTOR + 4
    assert pool.num_killed == 1
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, (
        "still burning CPU"
    )
    # a fresh worker
    assert pool.submit("index", grammar_key("regex", "ab"), 30).result()[0] == "ab"


def test_a_worker_that_died_while_idle_is_replaced(pool):
    """An idle worker killed from outside (the OOM killer, say): the next job still runs, on a new one."""
    pool.submit("regex", grammar_key("regex", "a"), 30).result()
    (pid,) = worker_pids(pool)
    psutil.Process(pid).kill()
    psutil.Process(pid).wait(10)
    assert pool.submit("index", grammar_key("regex", "a+b"), 30).result(timeout=60)[0] == "a+b"
    assert worker_pids(pool) != [pid]


def test_a_compile_past_its_memory_limit_fails_alone(pool):
    with pytest.raises(GrammarError, match="worker|MiB|cannot compile"):
        pool.submit("index", grammar_key("regex", "a{100000000}"), 30).result()
    assert pool.submit("index", grammar_key("regex", "b+"), 30).result()[0] == "b+"


def test_a_full_queue_refuses_at_once(pool):
    futures = [pool.submit("index", grammar_key("regex", EXPLOSIVE), 3)]
    deadline = time.monotonic() + 5
    while pool._pending and time.monotonic() < deadline:  # noqa: SLF001 (wait until the worker took it)
        time.sleep(0.01)
    futures += [
        pool.submit("index", grammar_key("regex", f"{EXPLOSIVE}{'b' * i}"), 3) for i in range(1, 4)
    ]
    with pytest.raises(GrammarError, match="too many grammars"):
        pool.submit("index", grammar_key("regex", "a"), 30).result(timeout=1)
    for f in futures:
        with pytest.raises(GrammarError):
            f.result()


def test_schema_size_is_bounded_before_any_normalisation():
    deep = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(GrammarError, match="deeper"):
        grammar_key("json_schema", deep)
    wide = {"anyOf": [{"const": i} for i in range(20_000)]}
    with pytest.raises(GrammarError, match="more than"):
        grammar_key("json_schema", wide)
    grammar_key("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}})  # fine


def test_the_time_limit_counts_from_when_a_worker_takes_the_job(pool):
    """A good grammar queued behind a slow one is compiled, not failed for the wait: the queue
    spends 2 s on the runaway, more than the 1 s the second job may compile for."""
    slow = pool.submit("index", grammar_key("regex", EXPLOSIVE), 2)
    quick = pool.submit("index", grammar_key("regex", "ab"), 1)
    with pytest.raises(GrammarError, match="longer than 2 s"):
        slow.result()
    assert quick.result(timeout=30)[0] == "ab"
    assert pool.num_killed == 1


def test_the_time_limit_counts_the_workers_cpu_not_the_wall_clock(pool):
    """A worker that gets no CPU for longer than the limit (stopped, as a niced worker starved by
    the model's steps is) finishes its job once it runs again; one that never runs again is still
    ended, at WALL_FACTOR times the limit."""
    from radixrt.runtime.constrained.compile_pool import WALL_FACTOR

    pool.submit("regex", grammar_key("regex", "a"), 30).result()  # a live worker, imports done
    (pid,) = worker_pids(pool)
    os.kill(pid, signal.SIGSTOP)
    try:
        job = pool.submit("index", grammar_key("regex", "(a|b)+b"), 0.5)
        time.sleep(1.5)  # three times the limit, without a CPU
    finally:
        os.kill(pid, signal.SIGCONT)
    assert job.result(timeout=30)[0] == "(a|b)+b"
    assert pool.num_killed == 0
    os.kill(pid, signal.SIGSTOP)  # for good: the wall bound ends its next job
    started = time.monotonic()
    with pytest.raises(GrammarError, match="longer than 0.2 s"):
        pool.submit("index", grammar_key("regex", "a+"), 0.2).result(timeout=30)
    assert 0.2 * WALL_FACTOR <= time.monotonic() - started < 0.2 * WALL_FACTOR + 10
    assert pool.num_killed == 1
    assert pool.submit("index", grammar_key("regex", "ab"), 30).result()[0] == "ab"


def test_a_workers_result_is_never_unpickled(tmp_path):
    """#56.9: results were pickles, so a worker whose memory a hostile grammar corrupted could run
    code in the server. They are JSON and raw bytes now: a pickle on the result pipe is refused."""
    import io
    import os
    import pickle
    import struct

    from radixrt.runtime.constrained.compile_worker import read_result, write_result

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    evil = pickle.dumps(("ok", Payload()))
    frame = struct.pack(">I", len(evil)) + evil + struct.pack(">Q", 0)
    with pytest.raises(ValueError):
        read_result(io.BytesIO(frame))
    assert not marker.exists()
    out = io.BytesIO()
    write_result(out, "ok", ["a+", None], b"\x00\x01")
    out.seek(0)
    assert read_result(out) == ("ok", ["a+", None], b"\x00\x01")
    with pytest.raises(ValueError):  # a status that is neither ok nor err
        out = io.BytesIO()
        write_result(out, "exec", None)
        out.seek(0)
        read_result(out)
