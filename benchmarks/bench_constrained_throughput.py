"""Tokens/s of a JSON-schema-constrained batch against the same batch unconstrained, with
jump-forward on and off, side by side in one run on the default model.

    python benchmarks/bench_constrained_throughput.py [--batch 16] [--single 4] [--max-new-tokens 64] [--repeats 3]

Jump-forward feeds the text the grammar forces (key names here) as a draft the model verifies
in the same forward; it saves forwards, which is what a request alone (batch 1) is bound by.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
PEOPLE = [
    "a retired teacher",
    "a young pilot",
    "a chess champion",
    "a baker from Lyon",
    "a marine biologist",
    "a jazz drummer",
    "a software engineer",
    "a mountain guide",
]


def run(
    engine: Engine, prompts: list[str], params: dict, one_by_one: bool
) -> tuple[float, int, int]:
    """(seconds, output tokens, forwards) of the prompts as one batch or one request at a time."""
    engine.flush_cache()
    forwards = engine.scheduler.stats.num_forwards
    t0 = time.perf_counter()
    outs = (
        [engine.generate(p, params) for p in prompts]
        if one_by_one
        else engine.generate(prompts, params)
    )
    secs = time.perf_counter() - t0
    return (
        secs,
        sum(o["meta_info"]["completion_tokens"] for o in outs),
        engine.scheduler.stats.num_forwards - forwards,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--single", type=int, default=4, help="requests run one at a time (batch 1)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(__file__), "results", "constrained_throughput.json"),
    )
    args = ap.parse_args()
    prompts = [
        f"Describe {PEOPLE[i % len(PEOPLE)]} (#{i}) as a JSON object with name, age, city and hobbies."
        for i in range(args.batch)
    ]
    base = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
    constrained = {**base, "json_schema": json.dumps(SCHEMA)}
    engines = {jf: Engine(enable_jump_forward=jf) for jf in (True, False)}
    for engine in engines.values():
        run(engine, prompts[:2], constrained, False)  # warm-up: compile + cache the index
    cases = ((f"batch {args.batch}", prompts, False), ("batch 1", prompts[: args.single], True))
    ratios: dict[tuple, list] = {}
    for _ in range(args.repeats):  # alternating: every case on both engines before the next repeat
        for label, batch, one_by_one in cases:
            for jf, engine in engines.items():
                accepted = engine.scheduler.stats.num_draft_accepted
                secs_c, toks_c, fwd_c = run(engine, batch, constrained, one_by_one)
                accepted = engine.scheduler.stats.num_draft_accepted - accepted
                # the same prompts unconstrained, producing the same number of tokens per request on average
                per_req = max(1, round(toks_c / len(batch)))
                secs_u, toks_u, _ = run(
                    engine,
                    batch,
                    {**base, "max_new_tokens": per_req, "ignore_eos": True},
                    one_by_one,
                )
                ratios.setdefault((label, jf), []).append(
                    {
                        "constrained_tok_s": toks_c / secs_c,
                        "unconstrained_tok_s": toks_u / secs_u,
                        "ratio": (toks_c / secs_c) / (toks_u / secs_u),
                        "tokens": toks_c,
                        "forwards": fwd_c,
                        "draft_tokens_taken": accepted,
                    }
                )
    for engine in engines.values():
        engine.shutdown()
    print(
        f"\nJSON schema with 4 required fields, greedy, {args.max_new_tokens} max new tokens; "
        f"median of {args.repeats} alternating runs (min-max)\n"
    )
    print(
        "| requests | jump-forward | constrained tok/s | unconstrained tok/s | ratio | constrained tokens "
        "| forwards | draft tokens taken |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for (label, jf), runs in sorted(ratios.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lo, hi = min(r["ratio"] for r in runs), max(r["ratio"] for r in runs)
        print(
            f"| {label} | {'on' if jf else 'off'} | {med['constrained_tok_s']:.1f} | {med['unconstrained_tok_s']:.1f} "
            f"| {med['ratio']:.2f}x ({lo:.2f}-{hi:.2f}) | {runs[-1]['tokens']} | {runs[-1]['forwards']} "
            f"| {runs[-1]['draft_tokens_taken']} |"
        )
        rows.append({"requests": label, "jump_forward": jf, "runs": runs, "median": med})
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    with open(args.out, "w") as f:
        json.dump({"commit": commit, "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
