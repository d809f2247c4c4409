"""Shared-prefix workload, side by side in one run: radixrt, radixrt with the cache off,
transformers `generate` one request at a time. Then batched decode throughput.

    python benchmarks/bench_shared_prefix.py [--num-questions 16] [--new-tokens 24]

Prints a table of output tokens/s and the ratios, and cached tokens against the optimum
(n - 1) x shared prefix length. Also decode tokens/s at batch 1/8/32 and the fraction of
the CPU's measured matmul rate that reaches.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from workloads import QUESTIONS, shared_prefix_prompts  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import resolve_model  # noqa: E402


def run_engine(engine: Engine, prompts: list[str], new_tokens: int) -> tuple[float, list[dict]]:
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    return time.perf_counter() - t0, outs


def run_transformers(model_dir, prompts: list[str], new_tokens: int) -> tuple[float, list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    warm = tok(prompts[0][-50:], return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        model.generate(**warm, max_new_tokens=2, do_sample=False)
        outs = []
        t0 = time.perf_counter()
        for p in prompts:
            enc = tok(p, return_tensors="pt", add_special_tokens=False)
            ids = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            outs.append(ids[0, enc["input_ids"].shape[1]:].tolist())
    return time.perf_counter() - t0, outs


def shared_len(engine: Engine, prompts: list[str]) -> int:
    ids = [engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    n = 0
    while all(len(x) > n and x[n] == ids[0][n] for x in ids):
        n += 1
    return n


def decode_throughput(engine: Engine, batch: int, new_tokens: int = 48) -> float:
    prompts = [f"Question: {QUESTIONS[i % len(QUESTIONS)]}\nAnswer:" for i in range(batch)]
    engine.flush_cache()
    t1, _ = run_engine(engine, prompts, 1)
    engine.flush_cache()
    tn, _ = run_engine(engine, prompts, new_tokens)
    return batch * (new_tokens - 1) / max(tn - t1, 1e-9)


def matmul_gflops(rows: int, k: int = 576, n: int = 1536, reps: int = 50) -> float:
    a, b = torch.randn(rows, k), torch.randn(k, n)
    for _ in range(5):
        a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * rows * k * n * reps / (time.perf_counter() - t0) / 1e9


def flops_per_token(engine: Engine) -> float:
    """Matmul FLOPs per token: 2 x the weights a token multiplies (layers + lm_head)."""
    model = engine.scheduler.runner.model
    params = sum(layer.qkv.numel() + layer.o.numel() + layer.gate_up.numel() + layer.down.numel()
                 for layer in model.layers)
    return 2.0 * (params + model.lm_head.numel())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-questions", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "shared_prefix.json"))
    args = ap.parse_args()
    prompts = shared_prefix_prompts(args.num_questions)
    model_dir = resolve_model(None)
    n, new = len(prompts), args.new_tokens
    rows, results = [], {}

    for label, kwargs in (("radixrt", {}), ("radixrt cache off", {"disable_radix_cache": True})):
        engine = Engine(**kwargs)
        run_engine(engine, [QUESTIONS[0]], 2)  # warm-up off the measured prompts
        engine.flush_cache()
        secs, outs = run_engine(engine, prompts, new)
        cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
        results[label] = {"seconds": secs, "tok_s": n * new / secs, "cached_tokens": cached,
                          "output_ids": [o["output_ids"] for o in outs]}
        if label == "radixrt":
            prefix_len = shared_len(engine, prompts)
            results["shared_prefix_tokens"] = prefix_len
            results["decode"] = {b: decode_throughput(engine, b) for b in (1, 8, 32)}
            results["flops_per_token"] = flops_per_token(engine)
        engine.shutdown()
        del engine
    if not args.skip_transformers:
        secs, outs = run_transformers(model_dir, prompts, new)
        results["transformers"] = {"seconds": secs, "tok_s": n * new / secs, "output_ids": outs}
        same = sum(a == b for a, b in zip(outs, results["radixrt"]["output_ids"]))
        results["greedy_equal_to_transformers"] = f"{same}/{n}"

    optimum = (n - 1) * results["shared_prefix_tokens"]
    base = results["radixrt"]["tok_s"]
    print(f"\nshared-prefix workload: {n} requests, shared prefix {results['shared_prefix_tokens']} tokens, "
          f"{new} new tokens each, greedy, all submitted at once ({torch.get_num_threads()} threads)\n")
    print("| engine | seconds | output tok/s | radixrt speedup | cached tokens |")
    print("|---|---|---|---|---|")
    for label in ("radixrt", "radixrt cache off", "transformers"):
        if label in results:
            r = results[label]
            cached = r.get("cached_tokens", "-")
            print(f"| {label} | {r['seconds']:.2f} | {r['tok_s']:.1f} | {base / r['tok_s']:.2f}x | {cached} |")
    print(f"\ncached tokens: {results['radixrt']['cached_tokens']} of optimum {optimum} "
          f"({100 * results['radixrt']['cached_tokens'] / max(optimum, 1):.1f}%)")
    if "greedy_equal_to_transformers" in results:
        print(f"greedy outputs equal to transformers: {results['greedy_equal_to_transformers']}")
    print("\n| decode batch | tok/s | GFLOP/s | fraction of matmul rate |")
    print("|---|---|---|---|")
    for b, tok_s in results["decode"].items():
        gflops = tok_s * results["flops_per_token"] / 1e9
        peak = matmul_gflops(b)
        print(f"| {b} | {tok_s:.1f} | {gflops:.1f} | {gflops / peak:.2f} (matmul {b}x576x1536: {peak:.0f} GFLOP/s) |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({k: v for k, v in results.items()}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
