"""Tensor parallel step time on this machine: the default model at --tp-size 1 and 3 (its 9 query / 3 KV heads
divide only by 3), side by side in one run.

    python benchmarks/bench_tp.py [--dtype auto] [--steps 32]

Decode: a batch of 1 and of 8 short prompts, `steps` tokens each (ignore_eos); ms per decode step =
(wall time of the whole generate - the same batch's prefill alone) / steps. Prefill: one 512-token prompt,
one output token, tokens/s. Each rank gets cores // tp_size threads. On a CPU with a few cores tensor
parallelism does not pay (the ranks share the same cores and add three all-reduces per layer); the point
is that it runs and is exact (tests/integration/test_tensor_parallel.py), and on several sockets, machines or
GPUs the same code splits the weights' bandwidth. Results: results/tp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_info import git_commit, machine  # noqa: E402

from radixrt import Engine  # noqa: E402

SHORT = [
    "Write a poem about the sea.",
    "List three fruits.",
    "What is 2+2?",
    "Name a color.",
    "Tell me a joke.",
    "Describe a cat.",
    "Why is the sky blue?",
    "Say hello.",
]


def timed(engine: Engine, prompts: list[str], max_new_tokens: int) -> float:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    start = time.perf_counter()
    engine.generate(prompts, params)
    return time.perf_counter() - start


def measure(tp_size: int, dtype: str, steps: int) -> dict:
    engine = Engine(dtype=dtype, tp_size=tp_size, max_total_tokens=8192, disable_radix_cache=True)
    try:
        timed(engine, SHORT[:2], 4)  # warm-up
        out = {}
        for batch in (1, 8):
            prompts = SHORT[:batch]
            prefill = min(timed(engine, prompts, 1) for _ in range(2))
            total = timed(engine, prompts, steps + 1)
            out[f"decode_ms_batch{batch}"] = (total - prefill) / steps * 1e3
        long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 56)  # ~512 tokens
        n = len(engine.tokenizer.encode(long_prompt))
        out["prefill_tok_s"] = n / min(timed(engine, [long_prompt], 1) for _ in range(3))
        out["prefill_tokens"] = n
        return out
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    results = {"commit": git_commit(), "machine": machine(), "dtype": args.dtype, "runs": {}}
    for tp_size in (1, 3):
        results["runs"][tp_size] = measure(tp_size, args.dtype, args.steps)
        print(f"tp_size {tp_size}: {results['runs'][tp_size]}", flush=True)
    one, three = results["runs"][1], results["runs"][3]
    print(
        f"\n== tensor parallel on {results['machine']['cpu']} ({results['machine']['cpu_count']} cores), "
        f"dtype {args.dtype} =="
    )
    print(f"{'':>22} {'tp 1':>10} {'tp 3':>10} {'tp3/tp1':>8}")
    for key, label in (
        ("decode_ms_batch1", "decode ms/step, bs 1"),
        ("decode_ms_batch8", "decode ms/step, bs 8"),
        ("prefill_tok_s", "prefill tok/s"),
    ):
        print(f"{label:>22} {one[key]:10.1f} {three[key]:10.1f} {three[key] / one[key]:8.2f}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tp.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
