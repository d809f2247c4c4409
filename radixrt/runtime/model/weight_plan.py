"""Which weight format each step size reads, measured on the machine the engine runs on.

A quantised checkpoint (a Q4 GGUF such as the default model's) is also kept in integer forms
(linear.py): its exact 4-bit codes where they are exact, int8 per output channel everywhere. Which
form a step reads depends on its row count and the machine: at one to a few rows the matmuls stream
the weights and the 4-bit codes read the fewest bytes; at more rows they are bound by arithmetic,
where oneDNN's bf16 GEMM (on a CPU that multiplies bf16 natively) or an int8 GEMM does the most per
cycle. No rule of thumb holds on every CPU (a 2-core Zen 4 EPYC: 4-bit 4.7 ms for a one-row step's
matmuls against bf16's 15; at 32 rows 4-bit 54 ms against bf16's 28), so the engine times each
candidate over the model's own linears at each range's row counts, keeps the fastest per range,
logs the table and caches it under $RADIXRT_CACHE_DIR keyed by the CPU, torch and the shapes. A
form no range reads is dropped (a plan without dense keeps only integer weights).

Under a compiled model the dynamic int8 path's activation quantisation and rescale are fused into
the graph's loops around the integer GEMM (llama_layer.linear), so that candidate is timed as the
GEMM alone; eager, as the whole eager sequence it runs.

--quantization: auto (measured among dense, the exact 4-bit codes and int8 weights for a quantised
checkpoint; dense for a float one), none (dense only), int4 / int8 / w8a8_int8 (that form at every
row count, int8 where a weight has no exact 4-bit form; w8a8_int8 is below the quality floor, see
AUTO).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import time
from typing import Sequence

import torch

from radixrt.runtime.model import int8_weight
from radixrt.runtime.model import weight_plan_timing as timing
from radixrt.runtime.model.dtype_choice import cpu_flags
from radixrt.runtime.model.linear import (
    DENSE,
    FORMAT_NAMES,
    INT4,
    INT8,
    INT8_DYN,
    MAX_ROWS,
    Linear,
)

log = logging.getLogger(__name__)

CHOICES = ("auto", "none", "int4", "int8", "w8a8_int8")
FORCED = {"int4": INT4, "int8": INT8, "w8a8_int8": INT8_DYN}
PLAN_FILE = "weight_plans.json"
REMEASURE_ENV = "RADIXRT_REMEASURE_WEIGHT_PLAN"  # 1: time the plan again, whatever is cached
ORIGIN_FIELDS = ("measured_at", "cpu", "stream_gb_per_s")


def wants_copies(
    quantization: str, quantized_checkpoint: bool, device: torch.device, dtype: str = "auto"
) -> bool:
    """Whether the loader builds integer copies (from the unrounded float32 weights). An explicit
    --dtype float32 under auto asks for float32 arithmetic (token-exact with transformers' float32),
    so it stays dense; dtype auto (float32 on a CPU without native bf16) takes the plan."""
    if device.type != "cpu" or quantization == "none" or not int8_weight.available():
        return False
    if quantization in FORCED:
        return True
    return quantized_checkpoint and dtype != "float32"


def probe_rows(buckets: Sequence[tuple[int, int]]) -> list[list[int]]:
    """The row counts each (min, max) bucket is timed at: its ends and their geometric middle (the
    large-step bucket at 512 rows: a prompt chunk)."""
    out = []
    for lo, hi in buckets:
        if hi > 4096:  # the large-step bucket
            out.append([max(lo, 512)])
        else:
            mid = round((lo * hi) ** 0.5)
            out.append(sorted({lo, mid, hi}))
    return out


# auto's candidates: the forms that hold the default model's quality floor. int8 x dynamically
# quantised activations does not (teacher-forced top-1 agreement with transformers fp32 91.8%
# eager at every row count against the floor's 95.8%; per-row activation scales cannot follow
# this model's activation outliers), so it is opt-in: --quantization w8a8_int8.
AUTO = (DENSE, INT4, INT8)
FEW_ROWS = 4


def candidates(linears: Sequence[Linear], quantization: str) -> list[int]:
    """The forms every linear can read (int4 where all layer weights have it)."""
    if quantization in FORCED:
        return [FORCED[quantization]]
    held = set.intersection(*(lin.formats() for lin in linears))
    return [f for f in AUTO if f in held]


def plan_ranges(buckets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The row ranges a plan gives a form each: the compiled buckets, the small-batch one split
    after FEW_ROWS (the 4-bit kernel's range on most CPUs). A form read through radixrt::linear
    may change inside a bucket (the operator picks by rows at run time); only int8-dyn, traced into
    the graphs, needs a whole bucket, and it is only ever forced, for every row count."""
    out = []
    for lo, hi in buckets:
        if lo <= FEW_ROWS < hi < 1 << 20:
            out += [(lo, FEW_ROWS), (FEW_ROWS + 1, hi)]
        else:
            out.append((lo, hi))
    return out


def _cpu_model() -> str:
    try:
        return next(
            (
                ln.split(":", 1)[1].strip()
                for ln in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            "",
        )
    except OSError:
        return ""


def _key(linears, ranges, cands, compiled, dtype) -> str:
    cpu = _cpu_model()
    shapes = sorted({(lin.out_features, lin.in_features) for lin in linears})
    machine = (torch.__version__, cpu, sorted(cpu_flags()), os.cpu_count(), torch.get_num_threads())
    text = repr((machine, str(dtype), shapes, list(ranges), cands, compiled))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def choose(
    linears: Sequence[Linear],
    buckets: Sequence[tuple[int, int]],
    quantization: str,
    compiled: bool,
    dtype: torch.dtype,
    cache_dir: pathlib.Path | None,
) -> tuple[tuple[int, ...], dict, dict]:
    """(the plan: max rows, format, ... ascending, the table behind it, where it comes from). One
    format per range of plan_ranges: the one with the least total time over the range's probe rows.
    A cached plan is read unless $RADIXRT_REMEASURE_WEIGHT_PLAN is 1; a measured one is cached only
    when every probe was steady (weight_plan_timing.py)."""
    cands = candidates(linears, quantization)
    if not cands:
        return (MAX_ROWS, DENSE), {}, {}
    key = _key(linears, plan_ranges(buckets), cands, compiled, dtype)
    path = cache_dir / PLAN_FILE if cache_dir else None
    remeasure = os.environ.get(REMEASURE_ENV) == "1"
    cached = _read(path).get(key) if path and not remeasure else None
    if cached:
        origin = {"source": "cached", **{k: cached.get(k) for k in ORIGIN_FIELDS}}
        return tuple(cached["plan"]), cached["table"], origin
    table: dict = {}
    plan: list[int] = []
    ranges = plan_ranges(buckets)
    bandwidth = timing.stream_bandwidth()
    doubts = []
    for (lo, hi), rows in zip(ranges, probe_rows(ranges)):
        times: dict[int, list[float]] = {f: [] for f in cands}
        for r in rows:
            medians, why = timing.time_steadily(linears, cands, r, compiled, dtype, bandwidth)
            doubts += [f"{r} rows: {why}"] if why else []
            for f in cands:
                times[f].append(medians[f])
        best = min(cands, key=lambda f: sum(times[f]))
        plan += [hi, best]
        table[f"{lo}-{hi}"] = {
            FORMAT_NAMES[f]: [round(t * 1e3, 2) for t in ts] for f, ts in times.items()
        } | {"rows": rows, "picked": FORMAT_NAMES[best]}
    origin = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": _cpu_model(),
        "stream_gb_per_s": round(bandwidth / 1e9, 1),
    }
    if doubts:
        log.warning(
            "weight plan: timings disagree with themselves (%s): used for this run, not cached",
            "; ".join(doubts),
        )
        return tuple(plan), table, {"source": "measured, not cached (unsteady)", **origin}
    if path:
        _write(path, key, {"plan": plan, "table": table, **origin})
    return tuple(plan), table, {"source": "measured", **origin}


def apply(
    model,
    quantization: str,
    buckets: Sequence[tuple[int, int]],
    compiled: bool,
    dtype: torch.dtype,
    cache_root: pathlib.Path,
    keep_dense: bool = False,
) -> tuple[tuple[int, ...], dict]:
    """Choose the plan over the model's linears (its layers' and the lm_head's), set it on every
    one (dropping the forms it does not read, but the dense weight when keep_dense) and log it ->
    (the plan, what /get_server_info shows the admin of it: the plan, where it comes from, when
    and on which CPU it was measured)."""
    layers = [lin for ly in model.layers for lin in (ly.qkv, ly.o, ly.gate_up, ly.down)]
    t0 = time.perf_counter()
    plan, table, origin = choose(layers, buckets, quantization, compiled, dtype, cache_root)
    for lin in [*layers, model.lm_head.linear]:
        lin.set_plan(plan, keep_dense)
    exact4 = sum(lin.int4 is not None for lin in layers)
    log.info(
        "weights by step size: %s; %d of %d layer weights exact 4-bit, %.1f s; %s",
        describe(plan, table),
        exact4,
        len(layers),
        time.perf_counter() - t0,
        describe_origin(origin),
    )
    return plan, {"plan": describe(plan, {}), **origin}


def describe_origin(origin: dict) -> str:
    if not origin:
        return "nothing to measure"
    when = f"measured {origin.get('measured_at') or '?'} on {origin.get('cpu') or '?'}"
    return f"{origin['source']} ({when}; {REMEASURE_ENV}=1 measures again)"


def describe(plan: Sequence[int], table: dict) -> str:
    parts, lo = [], 1
    for i in range(0, len(plan), 2):
        hi = plan[i]
        span = f"{lo}..{hi}" if hi < 1 << 20 else f"{lo}+"
        parts.append(f"{span} rows {FORMAT_NAMES[plan[i + 1]]}")
        lo = hi + 1
    measured = "; ".join(
        f"{span} at {row['rows']} rows: "
        + ", ".join(
            f"{k} {'/'.join(map(str, v))} ms" for k, v in row.items() if k not in ("rows", "picked")
        )
        for span, row in table.items()
    )
    return ", ".join(parts) + (f" (measured: {measured})" if measured else "")


def _read(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: pathlib.Path, key: str, entry: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path) | {key: entry}
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("weight plan: could not save %s: %s", path, e)
