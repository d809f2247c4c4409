"""DSL program workloads (in the spirit of SGLang's benchmark suite), each run three ways
in one process on the same machine:

  radixrt      the program on the in-process Engine (radix cache on, run_batch threads)
  cache off    the same program and threads on an Engine with disable_radix_cache=True
  transformers the same program's calls, one at a time, through HF `generate` / forward
               (no cache, no batching; regex/JSON constraints are not applied there)

Workloads: few-shot multiple choice (select), multi-turn chat, tree of thought
(nested fork/join), JSON decode (json_schema), ReAct agent loop.
Reports programs/s, output tokens/s, mean program latency and the cache hit rate
(cached / prompt tokens, from the runtime's counters); writes a table, JSON and a plot
to benchmarks/results/. `--scale 2` doubles every workload.

    python benchmarks/bench_programs.py [--scale 1] [--skip-transformers] [--workloads mc,chat]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict

import radixrt as sgl
from radixrt.frontend.backends import Backend, EngineBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from program_workloads import workloads  # noqa: E402

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
        return self.tokenizer.chat_template, self.tokenizer.bos_token or "", self.tokenizer.eos_token or ""

    def _one(self, ids: list[int], sp: dict, return_logprob: bool, start: int) -> dict:
        torch = self.torch
        max_new = sp.get("max_new_tokens", 128)
        meta = {"prompt_tokens": len(ids), "cached_tokens": 0, "completion_tokens": 0,
                "finish_reason": {"type": "length", "length": max_new}}
        with torch.inference_mode():
            if return_logprob:
                logits = self.model(torch.tensor([ids])).logits[0]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                meta["input_token_logprobs"] = [(None if i == 0 else float(logprobs[i - 1, ids[i]]), ids[i], None)
                                                for i in range(start, len(ids))]
            if max_new == 0:
                return {"text": "", "output_ids": [], "meta_info": meta}
            greedy = sp.get("temperature", 1.0) == 0
            out = self.model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=not greedy,
                                      temperature=None if greedy else sp["temperature"], top_p=None, top_k=None,
                                      stop_strings=sp.get("stop") or None, tokenizer=self.tokenizer,
                                      pad_token_id=self.tokenizer.eos_token_id)
        new = out[0, len(ids):].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        for stop in sp.get("stop") or []:
            cut = text.find(stop)
            text = text[:cut] if cut >= 0 else text
        meta["completion_tokens"] = len(new)
        return {"text": text, "output_ids": new, "meta_info": meta}

    def _generate(self, prompt=None, input_ids=None, sampling_params=None, return_logprob=False,
                  logprob_start_len=None, program_id=None, **_):
        single = isinstance(prompt, str) or (input_ids is not None and input_ids and isinstance(input_ids[0], int))
        if prompt is not None:
            id_lists = [self.tokenize(p) for p in ([prompt] if single else prompt)]
        else:
            id_lists = [input_ids] if single else input_ids
        with self.lock:  # one call at a time, as a plain transformers loop would run them
            outs = [self._one(ids, dict(sampling_params or {}), return_logprob, logprob_start_len or 0)
                    for ids in id_lists]
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
            generating = (params[0] if isinstance(params, list) else params).get("max_new_tokens", 1) > 0
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
    return {"wall_s": wall, "programs_per_s": len(batch) / wall, "output_tokens_per_s": timeline.output_tokens() / wall,
            "mean_latency_s": sum(latencies) / max(len(latencies), 1), "cache_hit_rate": cached / prompt if prompt else 0.0,
            "num_requests": len(timeline.rows), "errors": errors[:3],
            "texts": [s.stream_executor.text_ for s in states]}


def warm_up(backend: Backend) -> None:
    sgl.function(lambda s: s.__iadd__("Hello" + sgl.gen("x", max_tokens=2))).run(backend=backend, temperature=0)


def report(results: dict, path_base: str) -> None:
    modes = [m for m in ("radixrt", "cache off", "transformers") if any(m in r for r in results.values())]
    lines = [f"{'workload':<8} {'mode':<13} {'progs/s':>8} {'tok/s':>8} {'latency s':>10} {'hit rate':>9} "
             f"{'speedup':>8}"]
    for name, by_mode in results.items():
        base = by_mode.get("radixrt", {}).get("programs_per_s")
        for mode in modes:
            r = by_mode.get(mode)
            if r is None:
                continue
            speedup = f"{base / r['programs_per_s']:.2f}x" if base and mode != "radixrt" else ""
            lines.append(f"{name:<8} {mode:<13} {r['programs_per_s']:>8.2f} {r['output_tokens_per_s']:>8.1f} "
                         f"{r['mean_latency_s']:>10.2f} {r['cache_hit_rate']:>9.2f} {speedup:>8}")
        if "radixrt" in by_mode and "cache off" in by_mode:
            same = by_mode["radixrt"]["texts"] == by_mode["cache off"]["texts"]
            lines.append(f"{'':<8} outputs radixrt == cache off: {'yes' if same else 'NO'}")
    table = "\n".join(lines)
    print("\n" + table + "\n(speedup = radixrt programs/s over that mode's)")
    os.makedirs(RESULTS, exist_ok=True)
    with open(path_base + ".txt", "w") as f:
        f.write(table + "\n")
    with open(path_base + ".json", "w") as f:
        json.dump({n: {m: {k: v for k, v in r.items() if k != "texts"} for m, r in bm.items()}
                   for n, bm in results.items()}, f, indent=2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(modes)
    for k, mode in enumerate(modes):
        xs = [i + k * width for i in range(len(names))]
        axes[0].bar(xs, [results[n].get(mode, {}).get("programs_per_s", 0) for n in names], width, label=mode)
        axes[1].bar(xs, [results[n].get(mode, {}).get("cache_hit_rate", 0) for n in names], width, label=mode)
    for ax, title in zip(axes, ["programs / s (higher is better)", "cache hit rate"]):
        ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(names))], names)
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path_base + ".png", dpi=120)
    print(f"wrote {path_base}.txt, .json, .png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="repeat every workload's inputs this many times")
    parser.add_argument("--workloads", default="mc,chat,tot,json,agent")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--num-threads", type=int, default=16, help="run_batch threads for the radixrt modes")
    parser.add_argument("--out", default=os.path.join(RESULTS, "bench_programs"))
    args = parser.parse_args()
    chosen = args.workloads.split(",")
    all_workloads = workloads(args.scale)
    unknown = sorted(set(chosen) - set(all_workloads))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {sorted(all_workloads)}")

    from radixrt.runtime.model.weights import resolve_model

    model_dir = str(resolve_model(None))
    backends = {"radixrt": EngineBackend(sgl.Engine(model_dir)),
                "cache off": EngineBackend(sgl.Engine(model_dir, disable_radix_cache=True))}
    if not args.skip_transformers:
        backends["transformers"] = TransformersBackend(model_dir)
    for backend in backends.values():
        warm_up(backend)
    results: dict[str, dict] = {}
    for name in chosen:
        program, batch = all_workloads[name]
        results[name] = {}
        for mode, backend in backends.items():
            backend.flush_cache()
            threads = 1 if mode == "transformers" else args.num_threads
            results[name][mode] = r = run_mode(backend, program, batch, threads)
            print(f"{name:<6} {mode:<13} {len(batch)} programs in {r['wall_s']:.1f} s"
                  + (f"  errors: {r['errors']}" if r["errors"] else ""), flush=True)
    report(results, args.out)


if __name__ == "__main__":
    main()
