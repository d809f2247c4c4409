"""Many LoRA adapters on one server: decode throughput of a 16-request batch whose requests use 1, 4
or 8 different adapters, against the base model alone, side by side in one run.

    python benchmarks/bench_lora.py [--requests 16] [--new-tokens 32] [--rank 8] [--repeats 3]

Adapters: random PEFT adapters (peft, rank --rank, all seven projections, B non-zero) on the
default model, served by one Engine (--max-loras-per-batch 8) in the dtype its default picks here.
Every run is the same 16 prompts to exactly --new-tokens tokens (min_new_tokens), the adapters
assigned round robin. Printed per mix: wall time (median of --repeats alternating runs, min-max),
generated tokens/s, and the ratio to the base model in the same engine. A step with any adapter runs
its layers eager (the compiled graphs have no LoRA inputs): "base, eager" (a second engine with
--disable-torch-compile) separates that cost from the adapters' own. Raw results go to
benchmarks/results/lora.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from run_info import git_commit, machine  # noqa: E402
from workloads import QUESTIONS  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import transformers_dir  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(model_dir: str, root: str, count: int, rank: int) -> list[str]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for i in range(count):
        torch.manual_seed(i)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        cfg = LoraConfig(
            r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False
        )
        model = get_peft_model(base, cfg)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data.normal_(0, 0.02)
        path = os.path.join(root, f"a{i}")
        model.save_pretrained(path)
        paths.append(f"a{i}={path}")
    return paths


def run(engine: Engine, prompts: list[str], loras: list, new_tokens: int) -> float:
    params = {"temperature": 0, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(prompts, params, lora_path=loras)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    prompts = [f"Question: {q}\nAnswer:" for q in QUESTIONS[: args.requests]]
    root = tempfile.mkdtemp(prefix="radixrt-bench-lora-")
    paths = make_adapters(str(transformers_dir()), root, 8, args.rank)
    engine = Engine(lora_paths=paths, max_loras_per_batch=8)
    eager = Engine(disable_torch_compile=True)
    names = [p.split("=")[0] for p in paths]
    mixes = {"base": (engine, [None] * len(prompts)), "base, eager": (eager, [None] * len(prompts))}
    for k in (1, 4, 8):
        mixes[f"{k} adapter{'s' if k > 1 else ''}"] = (
            engine,
            [names[i % k] for i in range(len(prompts))],
        )
    times: dict[str, list[float]] = {m: [] for m in mixes}
    for eng, loras in mixes.values():  # warm-up: compiled shapes, adapters into their slots
        run(eng, prompts, loras, args.new_tokens)
    for _ in range(args.repeats):
        for mix, (eng, loras) in mixes.items():
            times[mix].append(run(eng, prompts, loras, args.new_tokens))
    tokens = len(prompts) * args.new_tokens
    base = statistics.median(times["base"])
    print(
        f"{len(prompts)} requests x {args.new_tokens} tokens, rank {args.rank}, dtype "
        f"{engine.scheduler.model_info['dtype']}, {os.cpu_count()} cores"
    )
    rows = []
    for mix, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {"mix": mix, "median_s": med, "min_s": min(ts), "max_s": max(ts), "tok_s": tokens / med}
        )
        print(
            f"{mix:>12}: {med:.2f} s ({min(ts):.2f}-{max(ts):.2f})  {tokens / med:6.1f} tok/s  "
            f"{base / med:.2f}x of base"
        )
    engine.shutdown()
    eager.shutdown()
    out = {
        "commit": git_commit(),
        "machine": machine(),
        "requests": len(prompts),
        "new_tokens": args.new_tokens,
        "rank": args.rank,
        "rows": rows,
    }
    path = os.path.join(os.path.dirname(__file__), "results", "lora.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
