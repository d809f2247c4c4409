"""Where one decode step goes, by torch.profiler: the engine's own forward (the whole-step graph,
layer graphs or eager, as the default config runs it) on a captured decode batch of
bench_vs_vllm.py's cases, the ops ranked by their self CPU time, plus the wall time of the step
without the profiler.

    python benchmarks/profile_decode_step.py [--cases batch-1,shared-16,shared-32] [--iters 20]

Cases: bench_vs_vllm's (batch-1: one ~25-token question; shared-16/32), and batch-1-long: one request
of shared-16's ~560-token prompt (bench_vs_llamacpp's context length).

The profiler's own cost per op (~2-5 us) inflates a step of many small ops: the un-profiled wall
time is the true step time, the table says where it goes. Compiled graphs appear as their
generated wrappers' kernel calls (cpp_fused_*), the matmuls as radixrt::linear or aten::_int_mm.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from radixrt import Engine
from radixrt.runtime.model.weights import load_tokenizer, resolve_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_vllm import build_cases, run_radixrt  # noqa: E402


def captured_decode(engine: Engine, case: dict):
    """Run the case once and keep the first forward whose rows are all of its requests' decodes."""
    runner = engine.scheduler.runner
    forward, captured = runner.forward, {}

    def capture(fb, *args, **kwargs):
        if fb.num_decode == fb.num_tokens == len(case["prompts"]) and "fb" not in captured:
            captured["fb"] = fb
        return forward(fb, *args, **kwargs)

    runner.forward = capture
    try:
        run_radixrt(engine, case)
    finally:
        del runner.forward
    return captured["fb"]


def how_run(runner, fb) -> str:
    if runner.step_graphs is not None and runner.step_graphs.takes(fb):
        return "the whole-step graph"
    return "layer graphs" if runner.graphs else "eager"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="batch-1,shared-16,shared-32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    cases, prefix_len = build_cases(load_tokenizer(str(resolve_model(None))))
    # one request at bench_vs_llamacpp's context (~550 tokens): attention over a long context
    one = cases["shared-16"]
    cases["batch-1-long"] = {"prompts": one["prompts"][:1], "new_tokens": one["new_tokens"]}
    engine = Engine()
    runner = engine.scheduler.runner
    try:
        for name in args.cases.split(","):
            fb = captured_decode(engine, cases[name])

            def step(fb=fb):
                runner.forward(fb)

            with torch.inference_mode():
                for _ in range(3):
                    step()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    step()
                wall = (time.perf_counter() - t0) / args.iters * 1e3
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(args.iters):
                        step()
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events) / args.iters / 1e3
            print(f"\n{name}: {fb.num_tokens} rows, {runner.dtype_name}, "
                  f"{how_run(runner, fb)}: step {wall:.2f} ms "
                  f"(profiled {total:.2f} ms)")  # fmt: skip
            ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
            for e in ranked:
                per_step = e.self_cpu_time_total / args.iters / 1e3
                print(f"  {per_step:7.2f} ms  {e.count // args.iters:5d} calls  {e.key[:70]}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
