"""The per-step-size weight plan (model/weight_plan.py): the fastest form per bucket by the
timings it is given, read back from its cache without timing again, and described in the log."""

import torch

from radixrt.runtime.model import weight_plan
from radixrt.runtime.model.int8_weight import Int8Weight
from radixrt.runtime.model.linear import DENSE, INT4, INT8, INT8_DYN, MAX_ROWS, IntCopies, Linear

BUCKETS = [(1, 1), (2, 32), (33, 1 << 20)]


def linears(n: int = 3) -> list[Linear]:
    w = torch.randn(16, 32)
    return [Linear(w, copies=IntCopies(None, Int8Weight.from_float(w))) for _ in range(n)]


def fake_times(table: dict[int, dict[int, float]], calls: list):
    """_time_pass returning table[fmt][rows] seconds, recording each call."""

    def timed(lins, fmt, rows, compiled, dtype):
        calls.append((fmt, rows))
        return table[fmt].get(rows, 1.0)

    return timed


def test_each_bucket_gets_its_fastest_form_and_the_cache_answers_next_time(tmp_path, monkeypatch):
    calls: list = []
    # int8 at few rows, dense beyond; the small-batch bucket split after FEW_ROWS
    times = {INT8: {1: 0.001, 2: 0.002, 3: 0.002, 4: 0.003, 5: 0.01, 13: 0.02, 32: 0.05, 512: 1.0},
             DENSE: {1: 0.002, 2: 0.003, 3: 0.003, 4: 0.004, 5: 0.005, 13: 0.01, 32: 0.02, 512: 0.3}}  # fmt: skip
    monkeypatch.setattr(weight_plan, "_time_pass", fake_times(times, calls))
    lins = linears()
    plan, table = weight_plan.choose(lins, BUCKETS, "auto", True, torch.float32, tmp_path)
    assert plan == (1, INT8, 4, INT8, 32, DENSE, 1 << 20, DENSE)
    assert table["5-32"]["rows"] == [5, 13, 32] and table["5-32"]["picked"] == "dense"
    assert {rows for _, rows in calls} == {1, 2, 3, 4, 5, 13, 32, 512}
    assert INT8_DYN not in {fmt for fmt, _ in calls}  # below the quality floor: never in auto
    calls.clear()
    again, _ = weight_plan.choose(lins, BUCKETS, "auto", True, torch.float32, tmp_path)
    assert again == plan and calls == []  # read from the cache
    # another candidate set (forced) is another key: timed, one form
    forced, _ = weight_plan.choose(lins, BUCKETS, "int8", True, torch.float32, tmp_path)
    assert set(forced[1::2]) == {INT8}


def test_candidates_and_when_copies_are_built():
    lins = linears()
    assert weight_plan.candidates(lins, "auto") == [DENSE, INT8]  # no exact 4-bit form
    assert weight_plan.candidates(lins, "int4") == [INT4]  # forced; int8 stands in where absent
    cpu = torch.device("cpu")
    assert weight_plan.wants_copies("auto", True, cpu)
    assert not weight_plan.wants_copies("auto", False, cpu)  # a float checkpoint stays dense
    assert weight_plan.wants_copies("int8", False, cpu)
    assert not weight_plan.wants_copies("none", True, cpu)
    assert not weight_plan.wants_copies("auto", True, torch.device("meta"))
    # an explicit float32 asks for float32 arithmetic; auto dtype (float32 without native bf16) plans
    assert not weight_plan.wants_copies("auto", True, cpu, "float32")
    assert weight_plan.wants_copies("auto", True, cpu, "auto")
    assert weight_plan.wants_copies("int4", True, cpu, "float32")


def test_describe_names_each_range_and_the_timings():
    text = weight_plan.describe(
        (1, INT4, 32, INT8_DYN, MAX_ROWS, INT8_DYN),
        {"1-1": {"int4": [4.7], "int8-dyn": [8.0], "rows": [1], "picked": "int4"}},
    )
    assert text.startswith("1..1 rows int4, 2..32 rows int8-dyn, 33+ rows int8-dyn")
    assert "1-1 at [1] rows: int4 4.7 ms, int8-dyn 8.0 ms" in text
