"""Tokens/s of a JSON-schema-constrained batch against the same batch unconstrained, with
jump-forward on and off, side by side in one run on the default model.

    python benchmarks/bench_constrained_throughput.py [--batch 16] [--max-new-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import time

from radixrt import Engine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
PEOPLE = ["a retired teacher", "a young pilot", "a chess champion", "a baker from Lyon", "a marine biologist",
          "a jazz drummer", "a software engineer", "a mountain guide"]


def run(engine: Engine, prompts: list[str], params: dict) -> tuple[float, int]:
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    secs = time.perf_counter() - t0
    return secs, sum(o["meta_info"]["completion_tokens"] for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    prompts = [f"Describe {PEOPLE[i % len(PEOPLE)]} (#{i}) as a JSON object with name, age, city and hobbies."
               for i in range(args.batch)]
    base = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
    rows = []
    for jump_forward in (True, False):
        engine = Engine(enable_jump_forward=jump_forward)
        run(engine, prompts[:2], {**base, "json_schema": json.dumps(SCHEMA)})  # warm-up: compile + cache the index
        secs_c, toks_c = run(engine, prompts, {**base, "json_schema": json.dumps(SCHEMA)})
        # the same batch unconstrained, producing the same number of tokens per request on average
        per_req = max(1, round(toks_c / len(prompts)))
        secs_u, toks_u = run(engine, prompts, {**base, "max_new_tokens": per_req, "ignore_eos": True})
        rows.append((jump_forward, toks_c / secs_c, toks_u / secs_u, toks_c, engine.scheduler.stats.num_forwards))
        engine.shutdown()
    print(f"\nbatch {args.batch}, JSON schema with 4 required fields, greedy\n")
    print("| jump-forward | constrained tok/s | unconstrained tok/s | ratio | constrained tokens |")
    print("|---|---|---|---|---|")
    for jf, c, u, toks, _ in rows:
        print(f"| {'on' if jf else 'off'} | {c:.1f} | {u:.1f} | {c / u:.2f}x | {toks} |")


if __name__ == "__main__":
    main()
