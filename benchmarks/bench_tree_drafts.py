"""Drafts from the radix tree (#57): the same question asked again, against the first asking, and
fresh requests with drafts on and off, side by side in one run on real `radixrt serve` processes
(HTTP, the default model and dtype).

    python benchmarks/bench_tree_drafts.py [--questions 8] [--tokens 64]

Two servers in turn: `--speculative-algorithm ngram` (tree drafts and prompt lookup) and `none`.
On each: every question asked once, one at a time ("first"), then each asked again ("again": the
tree holds the first answer after the prompt, so its drafts are that answer), then 16 fresh
questions at once ("fresh x16"). Greedy, a forced length. Printed per server: seconds an answer
first and again (one stream), again's speed-up over first, whether every second answer equals the
first token for token, and the fresh batch's tokens per second; and the ratios of drafts on to off
(the issue's bounds: again >= 2.5x first, fresh never below 0.95x). Raw: results/tree_drafts.json.
BENCH_EXTRA='{"enable_deterministic_inference": true}' (JSON: more server flags for both servers)
runs it in the batch-invariant mode, where a draft cannot change an answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from run_info import git_commit, machine  # noqa: E402

from radixrt.frontend.launcher import Runtime  # noqa: E402

RESULTS = Path(__file__).parent / "results"
EXTRA = json.loads(os.environ.get("BENCH_EXTRA", "{}"))
TOPICS = ["a lighthouse keeper", "a lost violin", "the first snow on a desert town", "a clockmaker",
          "two rival bakers", "a robot learning to paint", "an abandoned train station",
          "a beekeeper's secret", "the last library on the moon", "a fox and a crow",
          "a ship in a bottle", "a storm chaser", "a silent orchestra", "a garden on a roof",
          "a map with no names", "a kite that never landed", "a letter sent twice",
          "the oldest tree in a city", "a tailor's apprentice", "a bridge built overnight",
          "a cat who ran a hotel", "a painter who lost colour", "a river that ran uphill",
          "a market at midnight"]  # fmt: skip


def prompt(topic: str) -> str:
    return f"Write a short story about {topic}. Begin with a vivid first sentence."


def params(tokens: int) -> dict:
    return {
        "temperature": 0,
        "max_new_tokens": tokens,
        "min_new_tokens": tokens,
        "ignore_eos": True,
    }


def ask(url: str, topic: str, tokens: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/generate", json={"text": prompt(topic), "sampling_params": params(tokens)},
                   timeout=600)  # fmt: skip
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["output_ids"]


async def batch(url: str, topics: list[str], tokens: int) -> float:
    """Tokens per second of the topics asked at once."""
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        body = [{"text": prompt(t), "sampling_params": params(tokens)} for t in topics]
        answers = await asyncio.gather(*(client.post(url + "/generate", json=b) for b in body))
        for a in answers:
            a.raise_for_status()
        return len(topics) * tokens / (time.perf_counter() - t0)


def run(algorithm: str, args) -> dict:
    rt = Runtime(speculative_algorithm=algorithm, log_level="warning", **EXTRA)
    try:
        url = rt.url
        ask(url, "a warm-up", 8)
        asked = TOPICS[: args.questions]
        first = [ask(url, t, args.tokens) for t in asked]
        again = [ask(url, t, args.tokens) for t in asked]
        same = all(a[1] == b[1] for a, b in zip(first, again))
        fresh = asyncio.run(batch(url, TOPICS[args.questions : args.questions + 16], args.tokens))
        info = httpx.get(url + "/get_server_info", timeout=60).json()
    finally:
        rt.shutdown()
    first_s = sum(s for s, _ in first) / len(first)
    again_s = sum(s for s, _ in again) / len(again)
    return {
        "algorithm": algorithm,
        "first_s": first_s,
        "again_s": again_s,
        "speedup": first_s / again_s,
        "identical": same,
        "fresh16_tok_s": fresh,
        "draft_tokens": info.get("jump_forward_draft_tokens"),
        "draft_accepted": info.get("jump_forward_accepted_tokens"),
        "first_ids": [ids for _, ids in first],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if args.questions + 16 > len(TOPICS):
        raise SystemExit(f"--questions at most {len(TOPICS) - 16}")
    on, off = run("ngram", args), run("none", args)
    print(f"{args.questions} questions, {args.tokens} tokens each, greedy; then 16 fresh at once")
    print(
        f"{'drafts':8} {'first s':>8} {'again s':>8} {'again x':>8} {'same':>5} {'fresh x16 tok/s':>16}"
    )
    for r in (on, off):
        print(f"{r['algorithm']:8} {r['first_s']:8.3f} {r['again_s']:8.3f} {r['speedup']:8.2f} "
              f"{str(r['identical']):>5} {r['fresh16_tok_s']:16.1f}")  # fmt: skip
    print(f"on/off: first {off['first_s'] / on['first_s']:.2f}x, again "
          f"{off['again_s'] / on['again_s']:.2f}x, fresh x16 "
          f"{on['fresh16_tok_s'] / off['fresh16_tok_s']:.2f}x; answers equal on and off: "
          f"{on['first_ids'] == off['first_ids']}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = {"commit": git_commit(), "machine": machine(), "args": vars(args), "rows": [on, off]}
    (RESULTS / "tree_drafts.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
