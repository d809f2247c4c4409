"""Tokens/s of a JSON-schema-constrained batch against the same batch unconstrained, with
jump-forward on and off, side by side in one run on the default model.

    python benchmarks/bench_constrained_throughput.py [--batch 16] [--single 4] [--max-new-tokens 64]

Jump-forward feeds the text the grammar forces (key names here) as a draft the model verifies
in the same forward; it saves forwards, which is what a request alone (batch 1) is bound by.
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


def run(engine: Engine, prompts: list[str], params: dict, one_by_one: bool) -> tuple[float, int, int]:
    """(seconds, output tokens, forwards) of the prompts as one batch or one request at a time."""
    engine.flush_cache()
    forwards = engine.scheduler.stats.num_forwards
    t0 = time.perf_counter()
    outs = [engine.generate(p, params) for p in prompts] if one_by_one else engine.generate(prompts, params)
    secs = time.perf_counter() - t0
    return secs, sum(o["meta_info"]["completion_tokens"] for o in outs), engine.scheduler.stats.num_forwards - forwards


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--single", type=int, default=4, help="requests run one at a time (batch 1)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    prompts = [f"Describe {PEOPLE[i % len(PEOPLE)]} (#{i}) as a JSON object with name, age, city and hobbies."
               for i in range(args.batch)]
    base = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
    constrained = {**base, "json_schema": json.dumps(SCHEMA)}
    rows = []
    for jump_forward in (True, False):
        engine = Engine(enable_jump_forward=jump_forward)
        run(engine, prompts[:2], constrained, False)  # warm-up: compile + cache the index
        for label, batch, one_by_one in ((f"batch {args.batch}", prompts, False),
                                         ("batch 1", prompts[:args.single], True)):
            accepted = engine.scheduler.stats.num_draft_accepted
            secs_c, toks_c, fwd_c = run(engine, batch, constrained, one_by_one)
            accepted = engine.scheduler.stats.num_draft_accepted - accepted
            # the same prompts unconstrained, producing the same number of tokens per request on average
            per_req = max(1, round(toks_c / len(batch)))
            secs_u, toks_u, _ = run(engine, batch, {**base, "max_new_tokens": per_req, "ignore_eos": True}, one_by_one)
            rows.append((label, jump_forward, toks_c / secs_c, toks_u / secs_u, toks_c, fwd_c, accepted))
        engine.shutdown()
    print(f"\nJSON schema with 4 required fields, greedy, {args.max_new_tokens} max new tokens\n")
    print("| requests | jump-forward | constrained tok/s | unconstrained tok/s | ratio | constrained tokens "
          "| forwards | draft tokens taken |")
    print("|---|---|---|---|---|---|---|---|")
    for label, jf, c, u, toks, fwd, acc in sorted(rows, key=lambda r: (r[0], not r[1])):
        print(f"| {label} | {'on' if jf else 'off'} | {c:.1f} | {u:.1f} | {c / u:.2f}x | {toks} | {fwd} | {acc} |")


if __name__ == "__main__":
    main()
