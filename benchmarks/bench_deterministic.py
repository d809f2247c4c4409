"""What deterministic inference costs, and what it buys: three settings in one run (#44).

    python benchmarks/bench_deterministic.py [--prompts 40] [--tokens 32]

Settings: fast (--no-cache-invariant-prefill: the fast kernels for every step), default (the
cache-invariant prefill: steps computing prompt KV run the invariant kernels) and flag
(--enable-deterministic-inference: every step). For each, on the default model in this machine's
default dtype:
  16 / 32 shared-prefix   that many few-shot requests at once (one prefix, borrowed from the radix
                          cache after the first), 32 greedy tokens each: output tokens/s
  2,048-token prefill     one fresh prompt, one token: seconds
  batch 1                 one request decoding 64 tokens after a short prompt: tokens/s
  flips                   bench_cache_flips.py's cases on --prompts prompts: each alone on a flushed
                          cache is the reference; a mixed batch, alone with a warm cache, and a warm
                          batch are compared with it (flipped outputs; bitwise-equal logprobs)
Every engine is otherwise what `radixrt serve` runs (layers compiled where a C++ compiler is); the
flag, and the default's prompt steps, run eager (docs/deterministic-inference.md). Results:
results/deterministic.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from bench_cache_flips import flips, greedy, run
from run_info import git_commit, machine
from workloads import shared_prefix_prompts

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
PREFILL_TOKENS = 2048
DECODE_TOKENS = 64


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speeds(engine, tokens: int) -> dict:
    out = {}
    for n in (16, 32):
        prompts = shared_prefix_prompts(n)
        engine.flush_cache()
        engine.generate(prompts[:1], greedy(1))  # the prefix in the cache, as a warm server has it
        seconds = timed(lambda p=prompts: engine.generate(p, greedy(tokens)))
        out[f"shared_prefix_{n}_tok_s"] = n * tokens / seconds
    engine.flush_cache()
    ids = [100 + (i * 37) % 20000 for i in range(PREFILL_TOKENS)]
    out["prefill_2048_s"] = timed(lambda: engine.generate(input_ids=ids, sampling_params=greedy(1)))
    engine.flush_cache()
    seconds = timed(lambda: engine.generate("Tell me a story.", greedy(DECODE_TOKENS)))
    out["batch1_tok_s"] = DECODE_TOKENS / seconds
    return out


def flip_counts(engine, prompts: list[str], tokens: int) -> dict:
    ref = []
    for p in prompts:
        engine.flush_cache()
        ref += run(engine, [p], tokens, together=False)
    engine.flush_cache()
    cases = {"batch": run(engine, prompts, tokens, together=True)}
    cases["warm"] = run(engine, prompts, tokens, together=False)
    cases["warm batch"] = run(engine, prompts, tokens, together=True)
    return {name: flips(ref, got) for name, got in cases.items()}


SETTINGS = {
    "fast": {"cache_invariant_prefill": False},
    "default": {},
    "flag": {"enable_deterministic_inference": True},
}


def measure(setting: dict, args) -> dict:
    from radixrt.runtime.engine.engine import Engine

    engine = Engine(**setting)
    try:
        result = {"dtype": engine.scheduler.model_info["dtype"]}
        engine.generate(shared_prefix_prompts(4), greedy(4))  # warm-up, untimed
        result.update(speeds(engine, args.tokens))
        if not args.no_flips:
            result["flips"] = flip_counts(engine, shared_prefix_prompts(args.prompts), args.tokens)
        return result
    finally:
        engine.shutdown()


def report(results: dict, n: int) -> None:
    names = list(results)
    base = results["fast"]
    print(f"\ndefault model, dtype {base['dtype']}; one run (ratios against fast)")
    print("| measure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key, label in (
        ("shared_prefix_16_tok_s", "16 shared-prefix requests, output tok/s"),
        ("shared_prefix_32_tok_s", "32 shared-prefix requests, output tok/s"),
        ("prefill_2048_s", "2,048-token prefill, s"),
        ("batch1_tok_s", "batch 1 decode, tok/s"),
    ):
        cells = [f"{results[m][key]:.2f} ({results[m][key] / base[key]:.2f}x)" for m in names]
        print(f"| {label} | " + " | ".join(cells) + " |")
    if "flips" not in base:  # --no-flips
        return
    print("\nflipped outputs / bitwise-equal logprobs against each prompt alone on a flushed cache")
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for case in base["flips"]:
        cells = [
            f"{results[m]['flips'][case]['flips']} / {results[m]['flips'][case]['bitwise_logprobs']}"
            for m in names
        ]
        print(f"| {case} | " + " | ".join(cells) + f" |  (of {n})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--no-flips", action="store_true", help="the speeds only")
    args = ap.parse_args()
    from radixrt.runtime.engine.engine import Engine

    # an untimed start first: it compiles the layer graphs (or finds them cached), and the child
    # process a compiling start leaves to load them is done before the first timed engine starts
    Engine().shutdown()
    time.sleep(60)
    results = {name: measure(setting, args) for name, setting in SETTINGS.items()}
    report(results, args.prompts)
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": machine(), "commit": git_commit(), "tokens": args.tokens, **results}
    name = "deterministic_speeds.json" if args.no_flips else "deterministic.json"
    (RESULTS / name).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
