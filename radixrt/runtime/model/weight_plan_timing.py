"""Timing the weight plan's candidates so that load cannot spoil the plan (weight_plan.py).

A plan is timed once per machine and cached; a first start that shared the cores with something
else (a pip build) once timed the 4-bit form at one row at 912 ms instead of 4.5 and cached int8
for every single-row step for good. So each form is timed REPEATS times, the forms interleaved (a
burst of load hits them alike), and its median kept; and a probe's timings are steady only when

- each form's median is within MAX_SPREAD of its own fastest pass (the repeats agree), and
- at one row, where a pass streams the form's weights once, no form is more than MAX_BELOW_STREAM
  times slower than its bytes at the machine's streaming bandwidth (measured now: a sum over a
  buffer larger than the caches).

A probe that is not steady is timed again (up to ATTEMPTS times); a plan with one that never is
serves this run and is not cached.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

from radixrt.runtime.model import int8_weight
from radixrt.runtime.model.linear import DENSE, INT4, INT8_DYN, Linear, run_format

REPEATS = 5
ATTEMPTS = 3
MAX_SPREAD = 1.5
MAX_BELOW_STREAM = 20.0
STREAM_BYTES = 256 << 20
# at this many rows a pass is bound by arithmetic, not by streaming the weights: a few layers' worth
# of linears times it as well as all of them
COMPUTE_BOUND_ROWS = 64
COMPUTE_BOUND_LINEARS = 8


def stream_bandwidth() -> float:
    """Bytes a second the machine streams from memory (the best of three sums of a buffer far
    larger than the caches, on the threads the passes use)."""
    buf = torch.ones(STREAM_BYTES // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return STREAM_BYTES / best


def form_bytes(linears: Sequence[Linear], fmt: int, dtype: torch.dtype) -> int:
    """The weight bytes one pass of every linear reads in format fmt (the codes; scales aside)."""
    numel = sum(lin.numel() for lin in linears)
    if fmt == DENSE:
        return numel * torch.empty((), dtype=dtype).element_size()
    return numel // 2 if fmt == INT4 else numel


def one_pass(
    linears: Sequence[Linear], fmt: int, rows: int, compiled: bool, dtype: torch.dtype
) -> tuple[Callable[[], None], float]:
    """(a pass of the linears at `rows` rows in format fmt, the factor to all linears): past
    COMPUTE_BOUND_ROWS the pass runs the first few linears only."""
    subset = list(linears[:COMPUTE_BOUND_LINEARS]) if rows >= COMPUTE_BOUND_ROWS else list(linears)
    inputs = {}
    for lin in subset:
        if lin.in_features not in inputs:
            inputs[lin.in_features] = torch.randn(rows, lin.in_features).to(dtype)
    if fmt == INT8_DYN and compiled:  # the GEMM alone: the graph fuses the rest
        quantized = {k: int8_weight.quantize_rows(x)[0] for k, x in inputs.items()}

        def run() -> None:
            for lin in subset:
                torch._int_mm(quantized[lin.in_features], lin.int8.qweight.t())
    else:

        def run() -> None:
            for lin in subset:
                run_format(fmt, inputs[lin.in_features], lin.op_args())

    return run, len(linears) / len(subset)


def time_forms(
    linears: Sequence[Linear], cands: Sequence[int], rows: int, compiled: bool, dtype: torch.dtype
) -> tuple[dict[int, float], dict[int, list[float]]]:
    """Seconds of a pass per form at `rows` rows (the median of REPEATS, the forms interleaved,
    after one warm pass each) and every pass's time, per form."""
    passes = {f: one_pass(linears, f, rows, compiled, dtype) for f in cands}
    for run, _ in passes.values():
        run()
    samples: dict[int, list[float]] = {f: [] for f in cands}
    for _ in range(REPEATS):
        for f, (run, scale) in passes.items():
            t0 = time.perf_counter()
            run()
            samples[f].append((time.perf_counter() - t0) * scale)
    return {f: statistics.median(s) for f, s in samples.items()}, samples


def unsteady(
    medians: dict[int, float],
    samples: dict[int, list[float]],
    rows: int,
    streamed: dict[int, float],
) -> str | None:
    """Why a probe's timings cannot be trusted, or None. streamed: per form, the seconds its
    weights take to stream at the machine's bandwidth."""
    for f, s in samples.items():
        if medians[f] > MAX_SPREAD * min(s):
            return f"form {f}'s passes disagree ({min(s) * 1e3:.2f} to {max(s) * 1e3:.2f} ms)"
    if rows == 1:
        for f, t in medians.items():
            if t > MAX_BELOW_STREAM * streamed[f]:
                return (
                    f"form {f} took {t * 1e3:.2f} ms at one row, {t / streamed[f]:.0f}x its "
                    "weights' streaming time"
                )
    return None


def time_steadily(
    linears: Sequence[Linear],
    cands: Sequence[int],
    rows: int,
    compiled: bool,
    dtype: torch.dtype,
    bandwidth: float,
) -> tuple[dict[int, float], str | None]:
    """time_forms until a probe is steady (at most ATTEMPTS times) -> (medians, why the last one
    was not, or None)."""
    streamed = {f: form_bytes(linears, f, dtype) / bandwidth for f in cands}
    why = None
    for _ in range(ATTEMPTS):
        medians, samples = time_forms(linears, cands, rows, compiled, dtype)
        why = unsteady(medians, samples, rows, streamed)
        if why is None:
            break
    return medians, why
