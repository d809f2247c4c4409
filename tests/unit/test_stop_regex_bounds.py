"""#41: no automaton of client size is built in the server's own process. stop_regex's cheap check
refuses at once what its width proves too big (checked against interegular's own automata), the
edge builds the rest in a compile worker killed at its deadline with a CPU budget per request, and
a regex constraint's longest match comes from its parsed width (checked against brute force)."""

from __future__ import annotations

import gc
import itertools
import re
import time
from re import _parser as sre_parse

import interegular
import pytest

from radixrt.runtime.constrained.compile_pool import CompilePool, CompileTimeout
from radixrt.runtime.request import stop_regex_check
from radixrt.runtime.request.constraint_conflicts import longest_match_chars
from radixrt.runtime.request.regex_bounds import MAX_REGEX_EXPANSION, expanded_size
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.request.stop_regex import MAX_STATES, check_stop_regex
from radixrt.runtime.request.stop_regex_check import StopRegexChecker

NESTED = "(((a{9999}){9999}){9999})"
EXPLOSIVE = "[ab]*a[ab]{26}"  # 2**27 states
# CPU seconds of this thread (time.thread_time: other processes' load does not inflate it) that an
# in-process check may take; building EXPLOSIVE's or NESTED's automaton would take far longer
CPU_BOUND_S = 0.5
# wall seconds a build stopped at its 1 s deadline may take to be refused, on a loaded machine;
# without the deadline EXPLOSIVE's build runs for minutes
KILLED_WITHIN_S = 30.0


def cpu_seconds(fn) -> float:
    """CPU seconds this thread spent in fn()."""
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def cpu_seconds_without_gc(fn) -> float:
    """cpu_seconds(fn) after a full collection, with the collector off meanwhile: in the serial
    phase this process holds what earlier test files left, and a collection of it landing in fn
    counted ~0.6 s of this thread's CPU against a check that costs ~4 ms (a flaky failure)."""
    gc.collect()
    gc.disable()
    try:
        return cpu_seconds(fn)
    finally:
        gc.enable()


def states(pattern: str) -> int:
    return len(interegular.parse_pattern(pattern).to_fsm().states)


def refused(pattern: str) -> str | None:
    try:
        check_stop_regex(pattern)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("pattern", ["x{2048}", "(ab){1,1100}", "[a-c]{7}x{2041}"])
def test_what_the_width_refuses_has_too_many_states_indeed(pattern):
    why = refused(pattern)
    assert why is not None and "stop_regex" in why and "too complex" in why
    # the cheapest of three checks (a GC pause cannot land in all of them) against the build of
    # the automaton it refuses: building it, even stopped past MAX_STATES, costs about the build
    check_cpu = min(cpu_seconds(lambda: refused(pattern)) for _ in range(3))
    started = time.thread_time()
    assert states(pattern) > MAX_STATES  # interegular's own automaton: the refusal was right
    build_cpu = time.thread_time() - started
    assert check_cpu < build_cpu / 10, (check_cpu, build_cpu)


def test_just_under_the_bound_passes_the_cheap_check_and_fits():
    assert refused("x{2047}") is None and states("x{2047}") <= MAX_STATES


def test_nested_repeats_are_refused_at_once():
    assert "too complex" in refused(NESTED)
    assert cpu_seconds_without_gc(lambda: refused(NESTED)) < CPU_BOUND_S


@pytest.mark.parametrize("pattern", ["a*", "a|", "(?:)", "(ab)?", "x+", "a?b", "(a|b*)c?"])
def test_the_empty_match_check_agrees_with_the_automaton(pattern):
    fsm = interegular.parse_pattern(pattern).to_fsm()
    said_empty = "empty string" in (refused(pattern) or "")
    assert said_empty == (fsm.initial in fsm.finals)


def brute_longest(regex: str, max_len: int = 9) -> int | None:
    """The longest full match over {a, b, c} up to max_len characters; None when one of max_len
    matches (the patterns below are finite well short of it, or unbounded)."""
    best = None
    for n in range(max_len + 1):
        if any(re.fullmatch(regex, "".join(s)) for s in itertools.product("abc", repeat=n)):
            best = n
    return None if best == max_len else best


@pytest.mark.parametrize(
    "regex", ["", "a", "(ab){1,2}", "a{2,5}", "(a|bb)c?", "a*b", "(a|bc)+", "[ab]{3}|c"]
)
def test_longest_match_agrees_with_brute_force(regex):
    assert longest_match_chars(regex) == brute_longest(regex)


def test_longest_match_of_hostile_regexes_costs_nothing():
    def hostile():
        assert longest_match_chars(EXPLOSIVE) is None
        assert longest_match_chars(NESTED) == 9999**3
        assert longest_match_chars("(" * 5000 + ")" * 5000) is None  # too deep: no verdict

    assert cpu_seconds_without_gc(hostile) < CPU_BOUND_S


def test_the_pool_job_times_each_build_and_ends_at_a_refusal():
    pool = CompilePool(1, None, None, memory_bytes=512 << 20, max_pending=3)
    try:
        out = pool.submit("stop_regex", (r"\d\d", "a(?=b)", "x"), 30).result(60)
        assert isinstance(out[0], float) and 0 <= out[0] < 1
        assert len(out) == 2 and "lookarounds" in out[1]
        started = time.monotonic()
        with pytest.raises(CompileTimeout):
            pool.submit("stop_regex", (EXPLOSIVE,), 1).result(60)
        assert pool.num_killed == 1  # stopped at its deadline, not finished or crashed
        assert time.monotonic() - started < KILLED_WITHIN_S
        assert pool.submit("stop_regex", ("ab",), 30).result(60)[0] < 1  # a fresh worker
    finally:
        pool.shutdown()


@pytest.fixture
def checker():
    c = StopRegexChecker(memory_mb=512)
    yield c
    c.shutdown()


def test_the_checker_refuses_an_explosive_pattern_in_bounded_time(checker, monkeypatch):
    # a plain pattern passes (and starts the worker: a start slowed by load is not the point here)
    monkeypatch.setattr(stop_regex_check, "KILL_AFTER_S", KILLED_WITHIN_S)
    checker.check([r"[.!?]\s"])
    assert checker._pool.num_killed == 0
    monkeypatch.setattr(stop_regex_check, "KILL_AFTER_S", 1.0)
    started = time.monotonic()
    with pytest.raises(ValueError, match="stop_regex.*not built within 1 s"):
        checker.check(["\n\n", EXPLOSIVE])
    assert checker._pool.num_killed == 1  # its worker was killed at the deadline
    assert time.monotonic() - started < KILLED_WITHIN_S
    with pytest.raises(ValueError, match="stop_regex.*lookarounds"):  # the worker's verdict
        checker.check(["a(?=b)"])


def test_the_budget_is_per_request_and_verdicts_are_cached(checker, monkeypatch):
    jobs = []  # what reaches the compile worker
    submit = checker._pool.submit
    monkeypatch.setattr(checker._pool, "submit", lambda *a: jobs.append(a) or submit(*a))
    # the refusal below is the CPU budget's, not the deadline's: a worker start slowed by load
    # must not run into the deadline
    monkeypatch.setattr(stop_regex_check, "KILL_AFTER_S", KILLED_WITHIN_S)
    monkeypatch.setattr(stop_regex_check, "BUILD_BUDGET_S", 0.005)
    together = ["x{900}", "y{900}", "z{900}"]  # ~0.1 s each to build here
    with pytest.raises(ValueError, match="stop_regex.*automata take"):
        checker.check(together)
    assert [key for _, key, _ in jobs] == [tuple(together)]  # one round trip built all three
    monkeypatch.setattr(stop_regex_check, "BUILD_BUDGET_S", 10.0)
    checker.check(together)  # cached: no worker round trip, whatever the machine
    assert len(jobs) == 1


@pytest.mark.parametrize("regex", ["abc", "(ab){3}c", "((ab){2}c){4}", "x{7}(y{2}z){3}"])
def test_the_expansion_of_a_fixed_regex_is_its_one_match(regex):
    # no alternatives, no open repeat: the regex matches one string, as long as its expansion
    match = written_out(regex)
    assert re.fullmatch(regex, match)
    assert expanded_size(sre_parse.parse(regex)) == len(match)


def written_out(regex: str) -> str:
    """The one match of a regex of letters, groups and counts: innermost counts first."""
    while "{" in regex:
        regex = re.sub(r"\(([a-z]*)\)\{(\d+)\}|([a-z])\{(\d+)\}", _repeat, regex, count=1)
    return regex.replace("(", "").replace(")", "")


def _repeat(m: re.Match) -> str:
    body, count = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
    return body * int(count)


def test_a_regex_constraint_too_large_to_expand_is_refused_at_once_naming_regex():
    started = time.thread_time()
    for regex in (NESTED, "((a{99}){99}){99}", f"[0-9]{{{MAX_REGEX_EXPANSION + 1}}}"):
        with pytest.raises(ValueError, match="sampling parameter regex is too large"):
            SamplingParams.from_dict({"regex": regex})
    assert time.thread_time() - started < CPU_BOUND_S
    for regex in (EXPLOSIVE, f"[0-9]{{{MAX_REGEX_EXPANSION}}}", "(a|b)*c{1000}"):
        assert SamplingParams.from_dict({"regex": regex}).regex == regex
