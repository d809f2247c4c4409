"""Two replicas behind sglang-router: cache_aware vs round_robin on a multi-tenant shared-prefix workload.

    python benchmarks/bench_dp_router.py [--tenants 4] [--requests 48] [--concurrency 8] [--repeats 2]

Each policy gets its own `radixrt serve --dp-size 2 --router-policy P` (default config otherwise), one
after the other (never both at once on this machine), --repeats times alternating. The workload: several
tenants, each with its own ~300-token system prompt, and many users' short questions under them, sent
--concurrency at a time, streaming. Reported per policy: the prefix-cache hit rate the replicas saw
(cached / prompt tokens from each response), requests/s and output tok/s, TTFT p50 and p99 (p99 only
with >= 100 samples). Writes benchmarks/results/dp_router.{txt,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from run_info import git_commit, machine  # noqa: E402

from radixrt.runtime.processes import free_port, wait_until_healthy  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TOPICS = [
    "a bicycle repair shop",
    "an art museum",
    "a train timetable office",
    "a bakery",
    "a public library",
    "a zoo",
    "a hardware store",
    "a weather service",
]


def tenant_prompt(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    rules = " ".join(
        f"Rule {k}: stay polite, precise and brief when you talk about {topic}." for k in range(14)
    )
    return f"You are the assistant of {topic}. {rules}\n"


async def one(client: httpx.AsyncClient, text: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    ttft, meta = None, {}
    body = {
        "text": text,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    }
    async with client.stream("POST", "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and chunk.get("text"):
                ttft = time.perf_counter() - t0
            meta = chunk.get("meta_info", meta)
    return {
        "ttft": ttft if ttft is not None else time.perf_counter() - t0,
        "prompt": meta.get("prompt_tokens", 0),
        "cached": meta.get("cached_tokens", 0),
        "completion": meta.get("completion_tokens", 0),
    }


async def workload(url: str, args: argparse.Namespace, seed: int) -> dict:
    texts = [
        tenant_prompt(i % args.tenants)
        + f"User {i} (run {seed}) asks: what do you offer on day {i % 7}?\n"
        for i in range(args.requests)
    ]
    sem = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def limited(t: str) -> dict:
            async with sem:
                return await one(client, t, args.max_tokens)

        t0 = time.perf_counter()
        outs = await asyncio.gather(*(limited(t) for t in texts))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "requests": outs}


def run_policy(policy: str, args: argparse.Namespace, seed: int) -> dict:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixrt.cli",
            "serve",
            "--dp-size",
            "2",
            "--router-policy",
            policy,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 900)
        # warm-up
        asyncio.run(workload(url, argparse.Namespace(**{**vars(args), "requests": 4}), -1 - seed))
        return asyncio.run(workload(url, args, seed))
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"cache_aware": [], "round_robin": []}
    for k in range(args.repeats):
        for policy in runs:
            runs[policy].append(run_policy(policy, args, k))
    lines = [
        f"DP=2 behind sglang-router: {args.tenants} tenants (~300-token system prompts), {args.requests} "
        f"requests, {args.concurrency} at a time, {args.max_tokens} new tokens each; {args.repeats} runs per "
        f"policy, alternating\n",
        "| policy | hit rate | req/s (median) | out tok/s (median) | TTFT p50 (s) | TTFT p99 (s) |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for policy, rs in runs.items():
        reqs = [r for run in rs for r in run["requests"]]
        ttfts = sorted(r["ttft"] for r in reqs)
        hit = sum(r["cached"] for r in reqs) / max(1, sum(r["prompt"] for r in reqs))
        rps = statistics.median(len(run["requests"]) / run["seconds"] for run in rs)
        tps = statistics.median(
            sum(r["completion"] for r in run["requests"]) / run["seconds"] for run in rs
        )
        p99 = ttfts[int(0.99 * (len(ttfts) - 1))] if len(ttfts) >= 100 else None
        summary[policy] = {
            "hit_rate": hit,
            "req_s": rps,
            "out_tok_s": tps,
            "ttft_p50": statistics.median(ttfts),
            "ttft_p99": p99,
            "samples": len(ttfts),
        }
        lines.append(
            f"| {policy} | {100 * hit:.1f}% | {rps:.2f} | {tps:.1f} | {statistics.median(ttfts):.3f} | "
            f"{'n<100' if p99 is None else f'{p99:.3f}'} |"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dp_router.txt").write_text(text + "\n")
    (RESULTS / "dp_router.json").write_text(
        json.dumps(
            {
                "commit": git_commit(),
                "machine": machine(),
                "args": vars(args),
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
