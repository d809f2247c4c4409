"""Did a refactor make the engine slower? The same workloads on two git revisions, side by side in one run.

    python benchmarks/bench_commits.py --base <git-rev> [--head <git-rev> | worktree] [--repeats 3] [--quick]

The base (and a head given as a revision) is checked out with `git worktree add --detach` under
/tmp/radixrt-bench-<sha> (reused if present, removed at exit); the default head is this working tree,
uncommitted changes included. Every measurement is a fresh subprocess with PYTHONPATH=<tree root> first,
which checks that `radixrt` (and tests/fake_runner.py) came from that tree; runs alternate base, head,
base, head, ... and each figure is the median of --repeats runs. Workloads (higher is better everywhere):
  scheduler      64 requests, a 320-token shared prefix + 16 own tokens, 64 new tokens each, page size 16,
                 on the unit tests' fake model runner: scheduler steps/s, the fake runner's time excluded
                 (pure Python scheduling: intake, admission, planning, outputs)
  shared-16      the real default model (`Engine()`), 16 few-shot questions sharing a ~500-token prefix,
                 64 greedy tokens each: output tok/s (cache flushed before every run)
  batch-1        one short question, 64 greedy tokens: output tok/s
  prefill-32     32 questions sharing shared-16's prefix, one new token: requests/s (the prompt step:
                 by default the cache-invariant prefill)
Each subprocess warms the engine once (every case untimed; compiled graphs come from $RADIXRT_CACHE_DIR,
shared by both trees) before timing. --quick shrinks everything (a smoke test of a minute or two).
The table is printed and saved, with both revisions and the machine, to benchmarks/results/bench_commits.md.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
MARK = "BENCH_COMMITS "  # the child's result line on stdout
SIZES = {  # (scheduler: requests, prefix, own, new tokens, timed rounds), engine: shared requests, tokens
    "full": {"sched": (64, 320, 16, 64, 10), "shared": 16, "tokens": 64, "repeats": 3},
    "quick": {"sched": (8, 64, 8, 8, 1), "shared": 4, "tokens": 8, "repeats": 1},
}
VOCAB, PAGE_SIZE = 50, 16
REMOVE_AT_EXIT: set[pathlib.Path] = set()


# ---------------------------------------------------------------- child: one tree, one measurement
def first(name: str, *modules: str):
    """`name` from the first of modules that imports (modules move between revisions)."""
    errors = []
    for mod in modules:
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as e:
            errors.append(f"{mod}: {e}")
    raise ImportError(f"{name} in none of: {'; '.join(errors)}")


def check_tree(tree: pathlib.Path) -> None:
    import radixrt

    got = pathlib.Path(radixrt.__file__).resolve()
    if tree.resolve() not in got.parents:
        raise SystemExit(f"radixrt imported from {got}, not from the tree under test {tree}")


def sched_round(num: int, prefix: int, own: int, new: int) -> tuple[int, float]:
    """One scheduler run over the fake runner: (steps, seconds outside the runner)."""
    from fake_runner import FakeRunner

    ServerConfig = first("ServerConfig", "radixrt.runtime.config")
    Scheduler = first("Scheduler", "radixrt.runtime.core.scheduler", "radixrt.runtime.core")
    Req = first("TokenizedGenerateReq", "radixrt.runtime.messages")
    cfg = ServerConfig(page_size=PAGE_SIZE, max_running_requests=num)
    pages = num * (prefix + own + new) // PAGE_SIZE + 2 * num
    runner = FakeRunner(num_pages=pages, page_size=PAGE_SIZE, vocab_size=VOCAB, max_rows=num + 1)
    try:  # the unit tests' form: Scheduler(config, runner)
        s = Scheduler(cfg, runner)
    except TypeError:
        s = Scheduler(config=cfg, runner=runner)
    inner, in_runner = runner.run, [0.0]

    def timed_run(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            in_runner[0] += time.perf_counter() - t

    runner.run = timed_run
    rng = random.Random(0)
    shared = [rng.randrange(1, VOCAB) for _ in range(prefix)]
    params = {"max_new_tokens": new, "ignore_eos": True}
    msgs = [
        Req(
            rid=str(i),
            input_ids=shared + [rng.randrange(1, VOCAB) for _ in range(own)],
            sampling_params=dict(params),
        )
        for i in range(num)
    ]
    outs, steps = [], 0
    t0 = time.perf_counter()
    for msg in msgs:  # before #43 add_request returned outputs; since then only take_outputs()
        outs += s.add_request(msg) or []
    outs += s.take_outputs()
    while s.has_work() and steps < 100_000:
        s.step()
        outs += s.take_outputs()
        steps += 1
    seconds = time.perf_counter() - t0 - in_runner[0]
    got = {}
    for o in outs:
        got[o.rid] = got.get(o.rid, 0) + len(o.new_ids)
        if o.error:
            raise SystemExit(f"request {o.rid} failed: {o.error}")
    if got != {str(i): new for i in range(num)}:
        raise SystemExit(f"scheduler outputs incomplete: {got}")
    return steps, seconds


def scheduler_rate(size: tuple) -> float:
    *shape, rounds = size
    sched_round(*shape)  # warm-up: imports, first-call costs
    runs = [sched_round(*shape) for _ in range(rounds)]
    return sum(n for n, _ in runs) / sum(t for _, t in runs)


def engine_rates(num_shared: int, tokens: int) -> dict[str, float]:
    from workloads import QUESTIONS, shared_prefix_prompts

    Engine = first("Engine", "radixrt.runtime.engine.engine", "radixrt.runtime.engine")
    cases = {
        "shared-16": shared_prefix_prompts(num_shared),
        "batch-1": [f"Question: {QUESTIONS[0]}\nAnswer:"],
    }
    params = {
        "temperature": 0,
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "ignore_eos": True,
    }
    engine = Engine()

    def run(prompts: list[str], new: int) -> float:
        engine.flush_cache()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, {**params, "max_new_tokens": new, "min_new_tokens": new})
        seconds = time.perf_counter() - t0
        assert [len(o["output_ids"]) for o in outs] == [new] * len(prompts)
        return len(prompts) * new / seconds

    cases["prefill-32"] = shared_prefix_prompts(2 * num_shared)
    lengths = {name: 1 if name.startswith("prefill") else tokens for name in cases}
    try:
        for name, prompts in cases.items():  # warm-up, untimed
            run(prompts, lengths[name])
        return {name: run(prompts, lengths[name]) for name, prompts in cases.items()}
    finally:
        engine.shutdown()


def child(tree: pathlib.Path, quick: bool) -> None:
    size = SIZES["quick" if quick else "full"]
    sys.path.insert(0, str(tree / "tests"))  # that tree's fake_runner
    check_tree(tree)
    import fake_runner

    if tree.resolve() not in pathlib.Path(fake_runner.__file__).resolve().parents:
        raise SystemExit(f"fake_runner imported from {fake_runner.__file__}, not from {tree}")
    figures = {"scheduler": scheduler_rate(size["sched"])}
    figures.update(engine_rates(size["shared"], size["tokens"]))
    print(MARK + json.dumps(figures), flush=True)


# ---------------------------------------------------------------- parent: trees, runs, the table
def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def checkout(rev: str) -> tuple[pathlib.Path, str]:
    """A detached worktree of rev under /tmp (reused if there), removed at exit: (path, label)."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = pathlib.Path(f"/tmp/radixrt-bench-{sha[:12]}")
    if not path.exists():
        git("worktree", "add", "--detach", str(path), sha)
    elif git("-C", str(path), "rev-parse", "HEAD") != sha:
        raise SystemExit(f"{path} exists but is not a checkout of {sha}")
    if path not in REMOVE_AT_EXIT:  # base and head may be one commit
        REMOVE_AT_EXIT.add(path)
        atexit.register(
            subprocess.run, ["git", "worktree", "remove", "--force", str(path)], cwd=REPO
        )
    return path, f"{rev} ({sha[:12]})"


def measure(tree: pathlib.Path, quick: bool) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", str(tree)]
    out = subprocess.run(
        cmd + ["--quick"] * quick, cwd=tree, env=env, capture_output=True, text=True
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(MARK)]
    if out.returncode or not lines:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-8000:])
        raise SystemExit(f"the measurement in {tree} failed (exit {out.returncode})")
    return json.loads(lines[-1][len(MARK) :])


def table(base: list[dict], head: list[dict], size: dict) -> str:
    n, prefix, own, new, _ = size["sched"]
    names = {
        "scheduler": f"scheduler steps/s, fake runner ({n} req, {prefix}+{own} tok, {new} new)",
        "shared-16": f"engine shared prefix, {size['shared']} req x {size['tokens']} tok, out tok/s",
        "batch-1": f"engine batch 1, {size['tokens']} tok, out tok/s",
        "prefill-32": f"engine prefill, {2 * size['shared']} req sharing a prefix, 1 new tok, req/s",
    }
    rows = ["| workload | base | head | head/base |", "|---|---|---|---|"]
    for key, name in names.items():
        b = statistics.median(r[key] for r in base)
        h = statistics.median(r[key] for r in head)
        rows.append(f"| {name} | {b:,.1f} | {h:,.1f} | {h / b:.3f} |")
    return "\n".join(rows)


def save(text: str, base_label: str, head_label: str, repeats: int, quick: bool) -> None:
    from run_info import machine

    m = machine()
    load = " ".join(f"{x:.2f}" for x in m["loadavg_at_start"] or ())
    kind = "--quick: smoke-test sizes, not figures to compare" if quick else "full sizes"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_commits.md").write_text(
        f"# bench_commits.py\n\n- base: {base_label}\n- head: {head_label}\n"
        f"- medians of {repeats} alternating run(s), {kind}\n"
        f"- machine: {m['cpu']}, {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}, "
        f"load at start {load}\n"
        f"- RADIXRT_DISABLE_TORCH_COMPILE: {os.environ.get('RADIXRT_DISABLE_TORCH_COMPILE', 'unset')}"
        f"\n\n{text}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="git revision to compare against")
    ap.add_argument("--head", default="worktree", help="git revision, or 'worktree' (default)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads: a smoke test")
    ap.add_argument("--child", type=pathlib.Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.quick)
    if not args.base:
        ap.error("--base is required")
    size = SIZES["quick" if args.quick else "full"]
    repeats = args.repeats or size["repeats"]
    base_tree, base_label = checkout(args.base)
    if args.head == "worktree":
        from run_info import git_commit

        head_tree, head_label = REPO, f"working tree of {REPO} ({git_commit()})"
    else:
        head_tree, head_label = checkout(args.head)
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    for r in range(repeats):
        for name, tree in (("base", base_tree), ("head", head_tree)):
            t0 = time.perf_counter()
            runs[name].append(measure(tree, args.quick))
            figures = ", ".join(f"{k} {v:,.1f}" for k, v in runs[name][-1].items())
            print(
                f"  repeat {r + 1} {name}: {figures} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
            )
    text = table(runs["base"], runs["head"], size)
    print(f"\nbase: {base_label}\nhead: {head_label}\n\n{text}")
    save(text, base_label, head_label, repeats, args.quick)


if __name__ == "__main__":
    main()
