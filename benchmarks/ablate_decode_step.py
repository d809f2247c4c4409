"""Where one decode step's time goes, by ablation rather than a profiler (whose per-op overhead
inflates small ops): time the engine's own forward on a captured decode batch, then with the
matmuls replaced by free stand-ins (their cached outputs), the attention replaced, and both.

    python benchmarks/ablate_decode_step.py [--case shared-16|shared-32|batch-1] [--iters 30]

Cases are bench_vs_vllm.py's. Differences are not strictly additive: the matmuls stream every weight
from memory and evict what the other ops would find in cache, so "matmuls" includes that effect.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from radixrt import Engine
from radixrt.runtime.model import linear
from radixrt.runtime.model.weights import load_tokenizer, resolve_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_vllm import build_cases, run_radixrt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="shared-16")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    case = build_cases(load_tokenizer(str(resolve_model(None))))[0][args.case]
    engine = Engine()
    runner = engine.scheduler.runner
    model, kv, attn = runner.model, runner.kv, runner.attn
    captured = {}
    forward = model.forward

    def capture(fb, kv_, attn_):
        if fb.num_decode == fb.num_tokens == len(case["prompts"]) and "fb" not in captured:
            captured["fb"] = fb
        return forward(fb, kv_, attn_)

    model.forward = capture
    run_radixrt(engine, case)
    model.forward = forward
    fb = captured["fb"]

    def ms() -> float:
        with torch.inference_mode():
            for _ in range(3):
                model.forward(fb, kv, attn)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                model.forward(fb, kv, attn)
        return (time.perf_counter() - t0) / args.iters * 1e3

    full = ms()
    real_linear = linear.Linear.__call__
    linear_outs: dict = {}

    def free_linear(self, x):
        key = (id(self), x.shape[0])
        if key not in linear_outs:
            linear_outs[key] = real_linear(self, x)
        return linear_outs[key]

    linear.Linear.__call__ = free_linear
    no_matmul = ms()
    real_attn = attn.forward
    attn_outs: dict = {}

    def free_attn(q, k, v, k_cache, v_cache, fb_, scale):
        return attn_outs.setdefault(q.shape, torch.zeros(q.shape, dtype=q.dtype))

    attn.forward = free_attn
    neither = ms()
    linear.Linear.__call__ = real_linear
    no_attention = ms()
    attn.forward = real_attn
    engine.shutdown()
    print(
        f"{args.case} ({fb.num_tokens} rows, {engine.scheduler.runner.dtype_name}): forward {full:.2f} ms = "
        f"matmuls {full - no_matmul:.2f} + attention {full - no_attention:.2f} + everything else {neither:.2f} "
        f"(not strictly additive)"
    )


if __name__ == "__main__":
    main()
