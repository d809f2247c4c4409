"""Constrained decoding benchmark: JSONSchemaBench coverage, compile time, per-step mask cost.

    python benchmarks/bench_grammar.py [--backend all|outlines|llguidance|xgrammar] [--limit N] [--timeout 5]
        [--data DIR] [--validity 30] [--validity-tokens 128]

Part 1, coverage on the MaskBench sample (../shared/data/jsonschemabench next to the repo, 619 schemas): each
schema runs in a forked child (so a compile that overruns the timeout can be killed): schema ->
regex (or a GrammarError naming what we refuse), outlines-core Index over the default model's
vocabulary, then every test instance, serialised compactly, is tokenised and walked through
the index. Counted: schemas compiled within the timeout; valid instances accepted; invalid
instances rejected (an accepted invalid instance would be a soundness bug); schemas "passing"
in the MaskBench sense (compiled and every instance judged right). Valid instances that we
reject are mostly our chosen subsets (declaration key order, no undeclared keys, bounded
whitespace), not errors.

The same walk runs on llguidance's matcher (the schema -> its grammar, a matcher, its first mask: "compile";
then the bitmask fill per token). With both backends (the default, `all`) a third table is tallied from the
same runs: `auto` (--grammar-backend auto, the default), llguidance's result unless llguidance refused the
schema, else outlines', its compile time counted from the start of llguidance's attempt. (auto also compiles
outlines' DFA in the background of an llguidance-served request, only to steer it near the end of its budget;
the request does not wait for it, so it is not compile time.) The compile time of outlines includes the
budget-steering distance table, as in the server. llguidance is given declared keys only where a schema is
silent (--json-schema-strict, the server's default: a valid instance with an undeclared key is then rejected
and its schema counts as failing); --no-json-schema-strict measures JSON Schema's own semantics. Results in
results/grammar.json (grammar_standard.json without strict).

xgrammar (--grammar-backend xgrammar) runs the same walk on its GrammarMatcher: the schema -> its grammar
(xgrammar_compile.grammar_for: a schema with keywords xgrammar would not enforce is "rejected" with the
reason, as the server refuses it) and compiled (its token-mask caches precomputed: "compile"), then the
bitmask fill per token (fill_next_token_bitmask). Its compile time is measured in the child as for the
others; in the server the compile runs in a pool worker and the result crosses back serialized, which
adds a few ms.

Part 3, output validity (grammar_validity.py): `--validity N` sample schemas (default 30, at most 1500
characters each), generated greedily by the real default model under each backend and auto (an Engine
each, `--validity-tokens` new tokens at most), every output judged by jsonschema: refused / valid /
invalid / incomplete.

Part 2 (outlines only), cost per schema size: compile time, and per decoding step the mask cost per request:
outlines-core writing the bitmask (`write_mask_into`) and our whole fill_mask (bitmask + unpack
to a bool row), p50/p99 in µs over random walks.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from radixrt.runtime.constrained.backend import GrammarBackend, GrammarError, fill_masks
from radixrt.runtime.constrained.spec import grammar_key, spec_regex
from radixrt.runtime.model.weights import load_tokenizer, resolve_model

PUBLISHED = {"llguidance": 8909, "xgrammar": 8122, "outlines": 7050}  # of 11,306 MaskBench schemas
MASKBENCH_TOTAL = 11306
# the workplace's shared data sits next to the repository
DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench" / "maskbench"
)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def category(path: str) -> str:
    name = os.path.basename(path)
    return re.split(r"---|_", name)[0] if "---" in name else name.split("_")[0]


def _child(backend: GrammarBackend, tokenizer, path: str, conn) -> None:
    data = json.load(open(path))
    key = None
    try:
        t0 = time.perf_counter()
        key = grammar_key("json_schema", data["schema"])
        spec_regex(key)
        t1 = time.perf_counter()
    except GrammarError as e:
        conn.send({"status": "rejected", "reason": str(e)})
        return
    conn.send({"status": "converted", "convert_s": t1 - t0})
    try:
        compiled = backend.compile_in_process(key)
    except GrammarError as e:
        conn.send({"status": "compile_error", "reason": str(e)})
        return
    conn.send({"status": "compiled", "compile_s": time.perf_counter() - t1})
    results, write_us = [], []
    buf = torch.zeros(backend.num_words, dtype=torch.int32)
    for test in data["tests"]:
        text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
        state = backend.new_state(compiled)
        ok = True
        for tok in tokenizer.encode(text, add_special_tokens=False):
            t = time.perf_counter()
            state.guide.write_mask_into(buf.data_ptr(), buf.numel(), 4)
            write_us.append((time.perf_counter() - t) * 1e6)
            try:
                state.accept(tok)
            except GrammarError:
                ok = False
                break
        results.append((bool(test["valid"]), ok and state.is_final(), text[:160]))
    conn.send({"status": "done", "results": results, "write_us": write_us})


def _child_llg(backend, tokenizer, path: str, conn) -> None:
    from llguidance import LLMatcher
    from llguidance.torch import fill_next_token_bitmask

    from radixrt.runtime.constrained.llg_backend import grammar_for

    data = json.load(open(path))
    try:
        t0 = time.perf_counter()
        grammar = grammar_for(grammar_key("json_schema", data["schema"]), backend.strict)
        t1 = time.perf_counter()
    except GrammarError as e:
        conn.send({"status": "rejected", "reason": str(e)})
        return
    conn.send({"status": "converted", "convert_s": t1 - t0})
    matcher = LLMatcher(backend.tokenizer, grammar)
    buf = torch.zeros((1, backend.num_words), dtype=torch.int32)
    if not matcher.is_error():
        # llguidance builds lazily: the first mask is part of compiling
        fill_next_token_bitmask(matcher, buf, 0)
    if matcher.is_error():
        conn.send({"status": "compile_error", "reason": matcher.get_error()[:200]})
        return
    conn.send({"status": "compiled", "compile_s": time.perf_counter() - t0})
    results, write_us = [], []
    for test in data["tests"]:
        text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
        m, ok = LLMatcher(backend.tokenizer, grammar), True
        for tok in tokenizer.encode(text, add_special_tokens=False):
            t = time.perf_counter()
            fill_next_token_bitmask(m, buf, 0)
            write_us.append((time.perf_counter() - t) * 1e6)
            if not m.consume_token(tok):
                ok = False
                break
        results.append((bool(test["valid"]), ok and m.is_accepting(), text[:160]))
    conn.send({"status": "done", "results": results, "write_us": write_us})


def _child_xgr(backend, tokenizer, path: str, conn) -> None:
    import xgrammar as xgr

    from radixrt.runtime.constrained.xgrammar_compile import grammar_for

    data = json.load(open(path))
    try:
        t0 = time.perf_counter()
        grammar = grammar_for(
            grammar_key("json_schema", data["schema"]), backend.strict, capture=True
        )
        t1 = time.perf_counter()
    except GrammarError as e:
        conn.send({"status": "rejected", "reason": str(e)})
        return
    conn.send({"status": "converted", "convert_s": t1 - t0})
    try:
        compiled = xgr.GrammarCompiler(
            backend.info, max_threads=2, cache_enabled=False
        ).compile_grammar(grammar)
    except RuntimeError as e:
        conn.send({"status": "compile_error", "reason": str(e)[-200:]})
        return
    conn.send({"status": "compiled", "compile_s": time.perf_counter() - t0})
    results, write_us = [], []
    buf = torch.zeros((1, backend.num_words), dtype=torch.int32)
    for test in data["tests"]:
        text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
        m, ok = xgr.GrammarMatcher(compiled), True
        for tok in tokenizer.encode(text, add_special_tokens=False):
            t = time.perf_counter()
            m.fill_next_token_bitmask(buf, 0)
            write_us.append((time.perf_counter() - t) * 1e6)
            if not m.accept_token(tok):
                ok = False
                break
        results.append((bool(test["valid"]), ok and m.is_completed(), text[:160]))
    conn.send({"status": "done", "results": results, "write_us": write_us})


def run_schema(child, backend, tokenizer, path: str, timeout: float) -> dict:
    """One schema in a forked child: {"final": compiled/done/rejected/compile_error/timeout, "msg": the last
    message, "elapsed_s": wall time until the verdict on compiling (for auto's fallback)}."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    start = time.monotonic()
    proc = ctx.Process(target=child, args=(backend, tokenizer, path, send), daemon=True)
    proc.start()
    msg, final, elapsed, compile_s = None, "timeout", None, None
    deadline = time.monotonic() + 60
    while recv.poll(max(0.0, deadline - time.monotonic())):
        msg = recv.recv()
        final = msg["status"]
        if final == "converted":
            deadline = time.monotonic() + timeout  # the compile budget starts after conversion
        elif final == "compiled":
            deadline = time.monotonic() + 300
            elapsed, compile_s = time.monotonic() - start, msg["compile_s"]
        elif final in ("rejected", "compile_error", "done"):
            break
    if proc.is_alive():
        proc.kill()
    proc.join()
    if final in ("converted", "timeout"):
        final = "timeout"
    if elapsed is None:
        elapsed = time.monotonic() - start
    return {"final": final, "msg": msg, "elapsed_s": elapsed, "compile_s": compile_s}


def auto_record(first: dict, second: dict) -> dict:
    """--grammar-backend auto: llguidance's record unless it refused the schema or failed to compile it, then
    outlines' after it (compile time = llguidance's time to its verdict + outlines' compile)."""
    if first["final"] not in ("rejected", "compile_error", "timeout"):
        return first
    rec = dict(second, fallback=True)
    if second["compile_s"] is not None:
        rec["compile_s"] = first["elapsed_s"] + second["compile_s"]
    return rec


def tally(name: str, files: list[str], records: list[dict], timeout: float) -> dict:
    status, reasons = Counter(), Counter()
    compile_s, write_us, unsound = [], [], []
    valid, invalid = [0, 0], [0, 0]
    passing = 0
    per_cat: dict[str, list[int]] = {}
    # schema file -> passing | failing | rejected | compile_error | timeout
    outcomes: dict[str, str] = {}
    for path, rec in zip(files, records):
        final, msg = rec["final"], rec["msg"]
        # auto's fallback may overrun the budget
        ok = final == "done" and rec["compile_s"] <= timeout
        if final == "done" and not ok:
            final = "timeout"
        status[final if final != "done" else "compiled"] += 1
        if final in ("rejected", "compile_error"):
            reasons[re.sub(r"'[^']*'|\d+", "…", msg["reason"])[:90]] += 1
        if final == "done":
            compile_s.append(rec["compile_s"])
            write_us += msg["write_us"]
            for is_valid, accepted, text in msg["results"]:
                bucket = valid if is_valid else invalid
                bucket[0] += accepted == is_valid
                bucket[1] += 1
                ok &= accepted == is_valid
                if accepted and not is_valid:
                    unsound.append((os.path.basename(path), text))
            passing += ok
        outcomes[os.path.basename(path)] = (
            ("passing" if ok else "failing") if final == "done" else final
        )
        cat = per_cat.setdefault(category(path), [0, 0, 0])
        cat[0] += 1
        cat[1] += final == "done"
        cat[2] += final == "done" and ok
    total = len(files)
    compiled = status["compiled"]
    print(
        f"\n== {name}: JSONSchemaBench / MaskBench sample: {total} schemas, compile timeout {timeout:g} s =="
    )
    print(
        f"rejected with a named reason: {status['rejected']}   compile errors: {status['compile_error']}   "
        f"timeouts: {status['timeout']}"
    )
    if name == "auto":
        print(
            f"served by outlines after llguidance refused: {sum('fallback' in r for r in records)}"
        )
    print(f"compiled within {timeout:g} s: {compiled}/{total} = {compiled / total:.1%}")
    print(
        f"passing (compiled, every valid accepted and invalid rejected): {passing}/{total} = {passing / total:.1%}"
    )
    for pub, count in PUBLISHED.items():
        print(
            f"  published {pub:>10}: {count}/{MASKBENCH_TOTAL} = {count / MASKBENCH_TOTAL:.1%} (full set, not this sample)"
        )
    print(
        f"valid instances accepted:   {valid[0]}/{valid[1]}  (compact serialisation; rejections are chosen subsets)"
    )
    print(
        f"invalid instances rejected: {invalid[0]}/{invalid[1]}  (soundness; accepted invalid = bug)"
    )
    for schema, text in unsound[:10]:
        print(f"  UNSOUND {schema}: {text}")
    if compile_s:
        print(
            f"compile time (compiled ones): p50 {pct(compile_s, 0.5):.2f} s  p90 {pct(compile_s, 0.9):.2f} s  "
            f"p99 {pct(compile_s, 0.99):.2f} s  max {max(compile_s):.2f} s"
        )
    if write_us:
        print(
            f"mask write per step: p50 {pct(write_us, 0.5):.1f} µs  p99 {pct(write_us, 0.99):.1f} µs "
            f"({len(write_us)} steps)"
        )
    print("per category (schemas / compiled / passing):")
    for cat, (num, num_compiled, num_passing) in sorted(per_cat.items()):
        print(f"  {cat:>16} {num:4d} {num_compiled:4d} {num_passing:4d}")
    print("top reasons for refusing a schema:")
    for reason, count in reasons.most_common(12):
        print(f"  {count:4d}  {reason}")
    return {
        "schemas": total,
        "timeout_s": timeout,
        "status": dict(status),
        "compiled": compiled,
        "passing": passing,
        "valid_accepted": valid,
        "invalid_rejected": invalid,
        "unsound": unsound,
        "compile_s": compile_s,
        "compile_s_p99": pct(compile_s, 0.99) if compile_s else None,
        "write_mask_us_p50": pct(write_us, 0.5) if write_us else None,
        "write_mask_us_p99": pct(write_us, 0.99) if write_us else None,
        "per_category": per_cat,
        "refusal_reasons": dict(reasons.most_common()),
        "outcomes": outcomes,
    }


def coverage(runs: dict, tokenizer, files: list[str], timeout: float) -> dict:
    """runs: backend name -> (backend, child). With outlines and llguidance, `auto` is tallied too."""
    records: dict[str, list[dict]] = {name: [] for name in runs}
    for n, path in enumerate(files):
        for name, (backend, child) in runs.items():
            records[name].append(run_schema(child, backend, tokenizer, path, timeout))
        if (n + 1) % 50 == 0:
            print(f"  ... {n + 1}/{len(files)}", file=sys.stderr, flush=True)
    if "outlines" in runs and "llguidance" in runs:
        records["auto"] = [
            auto_record(a, b) for a, b in zip(records["llguidance"], records["outlines"])
        ]
    return {name: tally(name, files, recs, timeout) for name, recs in records.items()}


SIZES = {
    "small": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
    },
    "medium": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "created": {"type": "string", "format": "date-time"},
            "status": {"enum": ["open", "closed", "pending"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5},
            "owner": {
                "type": "object",
                "properties": {
                    "email": {"type": "string", "format": "email"},
                    "name": {"type": "string"},
                },
                "required": ["email"],
            },
        },
        "required": ["id", "status", "owner"],
    },
    "large": {
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string"},
                    "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "country": {"enum": ["US", "CA", "MX", "FR", "DE", "JP"]},
                },
                "required": ["street", "city", "country"],
            },
            "person": {
                "type": "object",
                "properties": {
                    "first": {"type": "string"},
                    "last": {"type": "string"},
                    "born": {"type": "string", "format": "date"},
                    "phones": {
                        "type": "array",
                        "items": {"type": "string", "pattern": "^\\+?[0-9 -]{7,15}$"},
                        "maxItems": 3,
                    },
                    "home": {"$ref": "#/$defs/address"},
                    "work": {"$ref": "#/$defs/address"},
                },
                "required": ["first", "last"],
            },
        },
        "type": "object",
        "properties": {
            "customer": {"$ref": "#/$defs/person"},
            "contacts": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 4},
            "notes": {"type": "string", "maxLength": 200},
            "vip": {"type": "boolean"},
        },
        "required": ["customer"],
    },
}


def step_costs(backend, vocab_size: int, walks: int = 20, steps: int = 150) -> dict:
    print("\n== compile time and mask cost per decoding step, per request (µs) ==")
    print(
        "write: outlines-core write_mask_into alone; fill: our fill_mask (bitmask + unpack to a bool row),"
    )
    print(
        "first visit of each state (cold) and the same walk replayed (warm); batch32: fill_masks of 32 rows / 32"
    )
    print(
        f"{'schema':>8} {'regex':>6} {'compile s':>9} {'write p50':>9} {'p99':>6} {'cold p50':>8} {'p99':>6} "
        f"{'warm p50':>8} {'p99':>6} {'batch32':>7}"
    )
    rng = random.Random(0)
    buf = torch.zeros(backend.num_words, dtype=torch.int32)
    row = torch.zeros(vocab_size, dtype=torch.bool)
    out = {}
    for name, schema in SIZES.items():
        key = grammar_key("json_schema", schema)
        rx = spec_regex(key)
        t = time.perf_counter()
        compiled = backend.compile_in_process(key)
        compile_s = time.perf_counter() - t
        write_us, cold_us, warm_us, batch_us, paths = [], [], [], [], []
        for _ in range(walks):
            state, path = backend.new_state(compiled), []
            for _ in range(steps):
                if state.is_terminated():
                    break
                t = time.perf_counter()
                state.fill_mask(row)
                cold_us.append((time.perf_counter() - t) * 1e6)
                allowed = [
                    i for i in row.nonzero().flatten().tolist() if i not in backend.eos_token_ids
                ]
                if not allowed:
                    break
                path.append(rng.choice(allowed[:64]))
                state.accept(path[-1])
            paths.append(path)
        for path in paths:
            state = backend.new_state(compiled)
            for tok in path:
                t = time.perf_counter()
                state.fill_mask(row)
                warm_us.append((time.perf_counter() - t) * 1e6)
                t = time.perf_counter()
                state.guide.write_mask_into(buf.data_ptr(), buf.numel(), 4)
                write_us.append((time.perf_counter() - t) * 1e6)
                state.accept(tok)
        states = [backend.new_state(compiled) for _ in range(32)]
        for _ in range(20):
            t = time.perf_counter()
            fill_masks(states, vocab_size, "cpu")
            batch_us.append((time.perf_counter() - t) * 1e6 / len(states))
        print(
            f"{name:>8} {len(rx):>6} {compile_s:>9.2f} {pct(write_us, 0.5):>9.1f} {pct(write_us, 0.99):>6.0f} "
            f"{pct(cold_us, 0.5):>8.1f} {pct(cold_us, 0.99):>6.0f} {pct(warm_us, 0.5):>8.1f} {pct(warm_us, 0.99):>6.0f} "
            f"{statistics.median(batch_us):>7.1f}"
        )
        out[name] = {
            "regex_len": len(rx),
            "compile_s": compile_s,
            "write_us": [pct(write_us, 0.5), pct(write_us, 0.99)],
            "cold_us": [pct(cold_us, 0.5), pct(cold_us, 0.99)],
            "warm_us": [pct(warm_us, 0.5), pct(warm_us, 0.99)],
            "batch32_us": statistics.median(batch_us),
            "steps": len(warm_us),
        }
    return out


def batch_walk_costs(make_state, tokenizer, files: list[str], name: str, batch: int = 32) -> dict:
    """A decoding batch of `batch` requests, each constrained by a different sample schema and walking that
    schema's first valid instance in lockstep: the time of one fill_masks over the rows still walking (what
    the scheduler pays per step), p50/p99 per step and per row, from the second step on."""
    states, paths = [], []
    for path in files:
        if len(states) == batch:
            break
        data = json.load(open(path))
        valid = [t for t in data["tests"] if t["valid"]]
        if not valid:
            continue
        try:
            state = make_state(data["schema"])
        except Exception:  # noqa: BLE001 - a schema this backend refuses is simply not in the batch
            continue
        states.append(state)
        paths.append(
            tokenizer.encode(
                json.dumps(valid[0]["data"], separators=(",", ":")), add_special_tokens=False
            )
        )
    step_us, row_us, rows = [], [], []
    for step in range(max(len(p) for p in paths)):
        live = [i for i, p in enumerate(paths) if step < len(p) and states[i] is not None]
        if not live:
            break
        t = time.perf_counter()
        fill_masks([states[i] for i in live], len(tokenizer), "cpu")
        dt = (time.perf_counter() - t) * 1e6
        # the first mask also builds llguidance's lazy automata: compile time, reported above
        if step:
            step_us.append(dt)
            row_us.append(dt / len(live))
            rows.append(len(live))
        for i in live:
            try:
                states[i].accept(paths[i][step])
            except GrammarError:  # an instance tokenized off the grammar's path: that row stops
                states[i] = None
    result = {
        "rows": len(states),
        "steps": len(step_us),
        "step_us": [pct(step_us, 0.5), pct(step_us, 0.99)],
        "row_us": [pct(row_us, 0.5), pct(row_us, 0.99)],
        "mean_live_rows": statistics.mean(rows),
    }
    print(
        f"\n== {name}: a batch of {len(states)} constrained requests (different sample schemas) walking valid instances =="
    )
    print(
        f"fill_masks per step: p50 {result['step_us'][0]:.0f} µs  p99 {result['step_us'][1]:.0f} µs; per row "
        f"p50 {result['row_us'][0]:.1f} µs  p99 {result['row_us'][1]:.1f} µs ({len(step_us)} steps after the first, "
        f"{result['mean_live_rows']:.1f} rows walking on average)"
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--limit", type=int, default=None, help="first N schemas (sorted by name)")
    ap.add_argument("--timeout", type=float, default=5.0, help="compile budget per schema, seconds")
    ap.add_argument("--skip-coverage", action="store_true")
    ap.add_argument(
        "--backend",
        default="all",
        choices=["all", "outlines", "llguidance", "xgrammar"],
        help="all: the three backends and auto (llguidance, outlines for what llguidance refuses)",
    )
    ap.add_argument(
        "--validity",
        type=int,
        default=30,
        help="sample schemas generated by the real model under each backend (0: skip)",
    )
    ap.add_argument("--validity-tokens", type=int, default=128, help="their max_new_tokens")
    ap.add_argument(
        "--no-json-schema-strict",
        dest="strict",
        action="store_false",
        help="llguidance and xgrammar follow JSON Schema (undeclared keys allowed), as the server's flag",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="default results/grammar.json (grammar_standard.json without strict)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(resolve_model(None))
    vocab_size = len(tokenizer)
    results = {
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "backend": args.backend,
        "json_schema_strict": args.strict,
        "batch32": {},
    }
    files = sorted(glob.glob(os.path.join(args.data, "*.json")))[: args.limit]
    batch_files = [f for f in files if "BFCL" in f] or files
    runs = {}
    if args.backend in ("all", "outlines"):
        backend = GrammarBackend(
            tokenizer, vocab_size, [tokenizer.eos_token_id], compile_timeout=args.timeout
        )
        results["step_costs"] = step_costs(backend, vocab_size)
        results["batch32"]["outlines"] = batch_walk_costs(
            lambda schema: backend.new_state(
                backend.compile_in_process(grammar_key("json_schema", schema))
            ),
            tokenizer,
            batch_files,
            "outlines",
        )
        runs["outlines"] = (backend, _child)
    if args.backend in ("all", "llguidance"):
        from radixrt.runtime.constrained.llg_backend import LLGuidanceBackend

        llg = LLGuidanceBackend(
            tokenizer,
            vocab_size,
            [tokenizer.eos_token_id],
            compile_timeout=args.timeout,
            strict=args.strict,
        )
        results["batch32"]["llguidance"] = batch_walk_costs(
            lambda schema: llg._build("json_schema", json.dumps(schema), []),
            tokenizer,
            batch_files,
            "llguidance",
        )
        runs["llguidance"] = (llg, _child_llg)
    if args.backend in ("all", "xgrammar"):
        from radixrt.runtime.constrained.xgrammar_backend import XGrammarBackend

        xgr = XGrammarBackend(
            tokenizer,
            vocab_size,
            [tokenizer.eos_token_id],
            compile_timeout=args.timeout,
            strict=args.strict,
        )
        results["batch32"]["xgrammar"] = batch_walk_costs(
            lambda schema: xgr.new_state(
                xgr.compile_in_process(grammar_key("json_schema", json.dumps(schema)))
            ),
            tokenizer,
            batch_files,
            "xgrammar",
        )
        xgr.pool.shutdown()  # the children compile in process
        runs["xgrammar"] = (xgr, _child_xgr)
    if not args.skip_coverage:
        results["coverage"] = coverage(runs, tokenizer, files, args.timeout)
    if args.validity:
        from grammar_validity import output_validity, sample_schemas

        names = list(runs) + (["auto"] if "outlines" in runs and "llguidance" in runs else [])
        results["validity"] = output_validity(
            names, sample_schemas(files, args.validity), args.validity_tokens, args.strict
        )
    name = "grammar.json" if args.strict else "grammar_standard.json"
    args.out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
