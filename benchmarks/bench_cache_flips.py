"""Does the cache (or the batch) change a greedy answer? Flip counts of the default config (#44).

    python benchmarks/bench_cache_flips.py [--prompts 40] [--tokens 32]

The reference is each prompt alone on a flushed cache, one at a time: nothing shares its batch and
its whole prompt is computed in its own prefill. Against it, three runs of the same greedy
requests on the same engine:
  batch       all prompts at once on a flushed cache (decode rows and prefill chunks mixed; the
              shared few-shot prefix computed once, by whichever request came first)
  warm        each prompt alone again, its few-shot prefix now from the radix cache (computed in
              the batch above, in another batch shape)
  warm batch  all prompts at once again, every prefix from the cache
A flip is a request whose output ids differ from its reference; the table gives the flips, and for
the flipped ones the first differing position and how far the two logprobs of the reference's
token there are apart. The engine is the default one (its default dtype on this machine), so this
measures what a user of the default config sees; no flag asks for determinism yet.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

from run_info import git_commit, machine
from workloads import shared_prefix_prompts

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def greedy(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}


def run(engine, prompts: list[str], tokens: int, together: bool) -> list[dict]:
    """Output ids and per-token logprobs of each prompt (together: one batched call)."""
    kw = dict(sampling_params=greedy(tokens), return_logprob=True)
    outs = (
        engine.generate(prompts, **kw) if together else [engine.generate(p, **kw) for p in prompts]
    )
    return [
        {
            "ids": o["output_ids"],
            "logprobs": [lp for lp, _, *_ in o["meta_info"]["output_token_logprobs"]],
        }
        for o in outs
    ]


def flips(ref: list[dict], got: list[dict]) -> dict:
    """How many outputs differ from the reference, where, and by how much at the first difference."""
    firsts, gaps = [], []
    for r, g in zip(ref, got):
        diff = [i for i, (a, b) in enumerate(zip(r["ids"], g["ids"])) if a != b]
        if diff:
            firsts.append(diff[0])
            gaps.append(abs(r["logprobs"][diff[0]] - g["logprobs"][diff[0]]))
    exact_lp = sum(r["logprobs"] == g["logprobs"] for r, g in zip(ref, got))
    return {
        "flips": len(firsts),
        "bitwise_logprobs": exact_lp,
        "first_diff_median": statistics.median(firsts) if firsts else None,
        "logprob_gap_max": max(gaps) if gaps else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    from radixrt.runtime.engine.engine import Engine

    prompts = shared_prefix_prompts(args.prompts)
    engine = Engine()
    try:
        dtype = engine.scheduler.model_info["dtype"]
        ref = []
        for p in prompts:
            engine.flush_cache()
            ref += run(engine, [p], args.tokens, together=False)
        engine.flush_cache()
        cases = {"batch": run(engine, prompts, args.tokens, together=True)}
        cases["warm"] = run(engine, prompts, args.tokens, together=False)
        cases["warm batch"] = run(engine, prompts, args.tokens, together=True)
    finally:
        engine.shutdown()
    rows = {name: flips(ref, got) for name, got in cases.items()}
    n = len(prompts)
    print(f"\n{n} greedy requests x {args.tokens} tokens, default model, dtype {dtype}")
    print(
        "| case | flipped outputs | bitwise-equal logprobs | first diff (median) | logprob gap (max) |"
    )
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        gap = "-" if r["logprob_gap_max"] is None else f"{r['logprob_gap_max']:.3g}"
        first = "-" if r["first_diff_median"] is None else r["first_diff_median"]
        print(f"| {name} | {r['flips']} / {n} | {r['bitwise_logprobs']} / {n} | {first} | {gap} |")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "machine": machine(),
        "commit": git_commit(),
        "dtype": dtype,
        "tokens": args.tokens,
        "cases": rows,
    }
    (RESULTS / "cache_flips.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
