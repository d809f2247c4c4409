"""Shared-prefix workload, side by side in one run, each engine at its best, runs alternating.

    python benchmarks/bench_shared_prefix.py [--num-questions 16] [--new-tokens 24] [--repeats 3]

Engines, all in the dtype radixrt's default picks on this machine (dtype auto), default threads:
  radixrt                     the default config: batching + radix prefix cache
  radixrt, cache off          the same engine without the cache            -> ratio = the caching effect
  transformers, batched       one generate() over all prompts, left padding -> ratio = caching (both batch)
  transformers, prefix KV     the shared prefix's KV computed once and reused, requests one at a time
                                                                           -> ratio = batching (both cache)
Every figure is the median of --repeats alternating runs (min-max shown). Cached tokens are compared
with an upper bound: per request, its longest common prefix with any other prompt (less its last token).
Then decode tok/s at batch 1/8/32 against the matmul rate measured at the same shapes and dtype.
Also the cost of the cache view's per-node hit counting (RadixCache.record_hit, once per admitted request),
timed inside radixrt's runs. Raw results (and the commit) go to benchmarks/results/shared_prefix.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from workloads import QUESTIONS, shared_prefix_prompts  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.core.token_prefix import common_prefix_len  # noqa: E402
from radixrt.runtime.model.linear import Linear  # noqa: E402
from radixrt.runtime.model.weights import transformers_dir  # noqa: E402


def run_engine(engine: Engine, prompts: list[str], new_tokens: int) -> tuple[float, list[dict]]:
    params = {
        "temperature": 0,
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "ignore_eos": True,
    }
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - t0, outs


class Transformers:
    def __init__(self, model_dir, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    def batched(self, prompts: list[str], new_tokens: int) -> tuple[float, list[list[int]]]:
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            t0 = time.perf_counter()
            ids = self.model.generate(
                **enc,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=self.tok.pad_token_id,
            )
            secs = time.perf_counter() - t0
        return secs, [row[enc["input_ids"].shape[1] :].tolist() for row in ids]

    def prefix_reuse(
        self, prompts: list[str], prefix_len: int, new_tokens: int
    ) -> tuple[float, list[list[int]]]:
        """The shared prefix's KV once, then each request continues from a copy of it."""
        import copy

        ids = [
            self.tok(p, return_tensors="pt", add_special_tokens=False)["input_ids"] for p in prompts
        ]
        outs = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            prefix_cache = self.model(ids[0][:, :prefix_len], use_cache=True).past_key_values
            for x in ids:
                cache = copy.deepcopy(prefix_cache)
                out = self.model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    past_key_values=cache,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=self.tok.pad_token_id,
                )
                outs.append(out[0, x.shape[1] :].tolist())
            secs = time.perf_counter() - t0
        return secs, outs


def cached_upper_bound(ids: list[list[int]]) -> int:
    """No request can be served more cached prompt tokens than its longest common prefix with another
    prompt, nor its whole prompt (the last token's logits are needed)."""
    return sum(
        min(len(x) - 1, max(common_prefix_len(x, y) for j, y in enumerate(ids) if j != i))
        for i, x in enumerate(ids)
    )


def decode_throughput(engine: Engine, batch: int, new_tokens: int = 48) -> float:
    prompts = [f"Question: {QUESTIONS[i % len(QUESTIONS)]}\nAnswer:" for i in range(batch)]
    t1, _ = run_engine(engine, prompts, 1)
    tn, _ = run_engine(engine, prompts, new_tokens)
    return batch * (new_tokens - 1) / max(tn - t1, 1e-9)


def matmul_gflops(
    rows: int, dtype: torch.dtype, k: int = 576, n: int = 1536, reps: int = 50
) -> float:
    """The rate of the engine's own linear layer (prepacked where the engine prepacks) at a decode shape."""
    lin, x = Linear(torch.randn(n, k).to(dtype)), torch.randn(rows, k).to(dtype)
    for _ in range(5):
        lin(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        lin(x)
    return 2 * rows * k * n * reps / (time.perf_counter() - t0) / 1e9


def flops_per_token(engine: Engine) -> float:
    """Matmul FLOPs per token: 2 x the weights a token multiplies (layers + lm_head)."""
    model = engine.scheduler.runner.model
    params = sum(
        layer.qkv.numel() + layer.o.numel() + layer.gate_up.numel() + layer.down.numel()
        for layer in model.layers
    )
    return 2.0 * (params + model.lm_head.numel())


def time_hit_counting(engine: Engine) -> dict:
    """Wrap the tree's per-request hit counting with a timer; the returned dict accumulates calls/seconds."""
    tree = engine.scheduler.tree
    record_hit = tree.record_hit
    acc = {"calls": 0, "seconds": 0.0}

    def timed(node) -> None:
        t0 = time.perf_counter()
        record_hit(node)
        acc["seconds"] += time.perf_counter() - t0
        acc["calls"] += 1

    tree.record_hit = timed
    return acc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-questions", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "shared_prefix.json")
    )
    args = ap.parse_args()
    prompts = shared_prefix_prompts(args.num_questions)
    model_dir = transformers_dir()
    n, new = len(prompts), args.new_tokens

    radixrt = Engine()
    dtype = radixrt.scheduler.runner.model.dtype
    ids = [radixrt.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    prefix_len = min(common_prefix_len(ids[0], x) for x in ids[1:])
    runs = {"radixrt": lambda: run_engine(radixrt, prompts, new)}
    hit_counting = time_hit_counting(radixrt)
    cache_off = Engine(disable_radix_cache=True)
    runs["radixrt, cache off"] = lambda: run_engine(cache_off, prompts, new)
    if not args.skip_transformers:
        hf = Transformers(model_dir, dtype)
        runs["transformers, batched"] = lambda: hf.batched(prompts, new)
        runs["transformers, prefix KV reused"] = lambda: hf.prefix_reuse(prompts, prefix_len, new)
    for fn in runs.values():  # warm-up, not timed
        fn()
    hit_counting.update(calls=0, seconds=0.0)
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    outputs: dict[str, list] = {}
    for _ in range(args.repeats):
        for label, fn in runs.items():
            secs, outs = fn()
            seconds[label].append(secs)
            outputs[label] = outs
    cached = sum(o["meta_info"]["cached_tokens"] for o in outputs["radixrt"])
    bound = cached_upper_bound(ids)
    radixrt_ids = [o["output_ids"] for o in outputs["radixrt"]]

    results = {
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "dtype": str(dtype),
        "threads": torch.get_num_threads(),
        "requests": n,
        "new_tokens": new,
        "shared_prefix_tokens": prefix_len,
        "cached_tokens": cached,
        "cached_upper_bound": bound,
        "repeats": args.repeats,
        "engines": {},
    }
    for label in runs:
        rates = [n * new / s for s in seconds[label]]
        outs = (
            outputs[label]
            if not label.startswith("radixrt")
            else [o["output_ids"] for o in outputs[label]]
        )
        results["engines"][label] = {
            "seconds": seconds[label],
            "tok_s": rates,
            "median_tok_s": statistics.median(rates),
            "greedy_equal_to_radixrt": sum(a == b for a, b in zip(outs, radixrt_ids)),
        }
    run_seconds = sum(seconds["radixrt"])
    results["hit_counting"] = {
        "calls": hit_counting["calls"],
        "seconds": hit_counting["seconds"],
        "us_per_request": 1e6 * hit_counting["seconds"] / max(hit_counting["calls"], 1),
        "fraction_of_run": hit_counting["seconds"] / run_seconds,
    }
    results["decode"] = {b: decode_throughput(radixrt, b) for b in (1, 8, 32)}
    results["flops_per_token"] = flops_per_token(radixrt)

    base = results["engines"]["radixrt"]["median_tok_s"]
    print(
        f"\nshared-prefix workload: {n} requests, shared prefix {prefix_len} tokens, {new} new tokens each, "
        f"greedy, all submitted at once; {dtype}, {torch.get_num_threads()} threads; median of {args.repeats} "
        f"alternating runs (min-max)\n"
    )
    print(
        "| engine | output tok/s | radixrt speedup | what the ratio measures | greedy outputs = radixrt's |"
    )
    print("|---|---|---|---|---|")
    effect = {
        "radixrt": "-",
        "radixrt, cache off": "caching",
        "transformers, batched": "caching (both batch)",
        "transformers, prefix KV reused": "batching (both cache)",
    }
    for label, r in results["engines"].items():
        print(
            f"| {label} | {r['median_tok_s']:.1f} ({min(r['tok_s']):.1f}-{max(r['tok_s']):.1f}) | "
            f"{base / r['median_tok_s']:.2f}x | {effect[label]} | {r['greedy_equal_to_radixrt']}/{n} |"
        )
    print(
        f"\ncached tokens: {cached} of at most {bound} ({100 * cached / max(bound, 1):.1f}% of the upper bound)"
    )
    hc = results["hit_counting"]
    print(
        f"cache-view hit counting: {hc['calls']} requests, {hc['us_per_request']:.1f} us each, "
        f"{100 * hc['fraction_of_run']:.4f}% of radixrt's run time"
    )
    print("\n| decode batch | tok/s | GFLOP/s | fraction of the matmul rate at that batch |")
    print("|---|---|---|---|")
    for b, tok_s in results["decode"].items():
        gflops = tok_s * results["flops_per_token"] / 1e9
        peak = matmul_gflops(b, dtype)
        results.setdefault("matmul_gflops", {})[b] = peak
        print(
            f"| {b} | {tok_s:.1f} | {gflops:.1f} | {gflops / peak:.2f} (matmul {b}x576x1536: {peak:.0f} GFLOP/s) |"
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
