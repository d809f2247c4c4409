"""Prefill-decode disaggregation: one unified server vs `radixrt serve --pd 1p1d` (a prefill and a
decode server behind sglang-router's PD mode, KV moved over the pair's CURVE-authenticated ZeroMQ
channel) on the same Poisson mix of long prompts (~2k tokens, a few output tokens) and short chats (a short prompt, a longer answer).

    python benchmarks/bench_pd.py [--requests 100] [--rate 0.5] [--long-every 5] [--repeats 1]

The cores: the unified server has all of them; 1P1D splits them evenly (on 2 cores one thread each for the
prefill and the decode server), so this is the same machine, not more of it. What disaggregation buys is
that a long prefill never runs in the decode server's steps: the decode tail (ITL p99, max ITL: the
stalls) is the point on 2 cores, not throughput (the decode server decodes with half the cores).
Reported per setup: TTFT and ITL p50 / p99 (p99 needs >= 100 samples), max ITL, requests/s, output
tokens/s; for 1P1D the KV transfer throughput (MB/s) and time per request from the decode server's
counters. Runs alternate setups (never two at once). Writes benchmarks/results/pd.{txt,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from bench_serving import LaunchedServer, percentile, poisson_starts, stream_request  # noqa: E402
from run_info import git_commit, machine  # noqa: E402

from radixrt.runtime.processes import free_port  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
CHATS = [
    "Write a short note to a neighbour about a lost cat.",
    "Explain in a few sentences why the sky is blue.",
    "Give three tips for keeping houseplants alive.",
    "Describe a quiet morning at the seaside.",
    "What should I pack for a weekend of hiking?",
]


KEY = "bench-pd-router-and-pair-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def long_prompt(k: int) -> str:
    """~2k tokens, distinct per k (no cache hits between them), asking for a short answer."""
    items = " ".join(f"item {i} is number {(i * 7 + k) % 13};" for i in range(200))
    return f"Inventory list {k}: {items}\nWhich item has the number 5? Answer:"


def mix(args: argparse.Namespace, seed: int) -> list[tuple[str, int, bool]]:
    """(prompt, max_tokens, is_long) for each request, in arrival order."""
    rng = random.Random(seed)
    out = []
    for i in range(args.requests):
        if i % args.long_every == args.long_every - 1:
            out.append((long_prompt(seed * 1000 + i), args.long_tokens, True))
        else:
            out.append((f"Request {i}. " + rng.choice(CHATS), args.chat_tokens, False))
    return out


async def workload(url: str, args: argparse.Namespace, seed: int) -> list[dict]:
    reqs = mix(args, seed)
    starts = await poisson_starts(args.rate, len(reqs), random.Random(seed + 1))
    async with httpx.AsyncClient(timeout=600, headers=AUTH) as client:
        t0 = time.perf_counter()

        async def one(start: float, prompt: str, max_tokens: int, is_long: bool) -> dict:
            await asyncio.sleep(max(0.0, t0 + start - time.perf_counter()))
            body = {
                "model": "default",
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            res = await stream_request(client, url, "/v1/completions", body)
            return {**res, "long": is_long}

        return await asyncio.gather(*(one(s, *r) for s, r in zip(starts, reqs)))


def info_of(url: str) -> dict:
    return httpx.get(url + "/get_server_info", headers=AUTH, timeout=60).json()


def decode_url(router: str) -> str:
    workers = httpx.get(router + "/workers", headers=AUTH, timeout=30).json()["workers"]
    return next(w["url"] for w in workers if w["worker_type"] == "decode")


def run(setup: str, args: argparse.Namespace, seed: int) -> dict:
    # both setups behind the same key (--pd 1p1d needs one: the pair's secret), from the environment
    os.environ["RADIXRT_API_KEY"] = KEY
    extra = ["--pd", "1p1d", "--disaggregation-bootstrap-port", str(free_port())]
    server = LaunchedServer(extra if setup == "1p1d" else [], args)
    try:
        counters = decode_url(server.url) if setup == "1p1d" else server.url
        asyncio.run(workload(server.url, argparse.Namespace(**{**vars(args), "requests": 4}), 99))
        before = info_of(counters)
        t0 = time.perf_counter()
        results = asyncio.run(workload(server.url, args, seed))
        elapsed = time.perf_counter() - t0
        after = info_of(counters)
    finally:
        server.stop()
    moved = {k: after[k] - before[k] for k in after if k.startswith("kv_transfer")}
    return {
        "setup": setup,
        "seed": seed,
        "seconds": elapsed,
        "output_tokens": sum(r["tokens"] for r in results),
        "ttft_s": [r["ttft"] for r in results],
        "ttft_long_s": [r["ttft"] for r in results if r["long"]],
        "itl_gaps_s": [g for r in results for g in r["gaps"]],
        **moved,
    }


def summarize(setup: str, runs: list[dict]) -> dict:
    ttft = [x for r in runs for x in r["ttft_s"]]
    gaps = [x for r in runs for x in r["itl_gaps_s"]]
    seconds = sum(r["seconds"] for r in runs)
    row = {
        "setup": setup,
        "repeats": len(runs),
        "ttft_n": len(ttft),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
        "ttft_long_p50": percentile([x for r in runs for x in r["ttft_long_s"]], 50),
        "itl_n": len(gaps),
        "itl_p50": percentile(gaps, 50),
        "itl_p99": percentile(gaps, 99),
        "itl_max": max(gaps) if gaps else None,
        "requests_per_s": sum(len(r["ttft_s"]) for r in runs) / seconds,
        "output_tokens_per_s": sum(r["output_tokens"] for r in runs) / seconds,
    }
    transfers = sum(r.get("kv_transfers", 0) for r in runs)
    if transfers:
        num_bytes = sum(r["kv_transfer_bytes"] for r in runs)
        secs = sum(r["kv_transfer_seconds"] for r in runs)
        row["kv_transfers"] = transfers
        row["kv_mb_per_s"] = num_bytes / secs / 1e6 if secs else None
        row["kv_ms_per_request"] = 1000 * secs / transfers
        row["kv_mb_per_request"] = num_bytes / transfers / 1e6
    return row


def ms(x: float | None, need: int = 2) -> str:
    return f"n<{need}" if x is None else f"{1000 * x:.1f}"


def table(rows: list[dict]) -> str:
    head = (
        f"{'setup':<8} {'TTFT p50':>9} {'TTFT p99':>9} {'long TTFT p50':>14} {'ITL p50':>8} "
        f"{'ITL p99':>8} {'max ITL':>8} {'req/s':>6} {'out tok/s':>9} {'KV MB/s':>8} {'KV ms/req':>9}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['setup']:<8} {ms(r['ttft_p50']):>9} {ms(r['ttft_p99'], need=100):>9} "
            f"{ms(r['ttft_long_p50']):>14} {ms(r['itl_p50']):>8} {ms(r['itl_p99'], need=100):>8} "
            f"{ms(r['itl_max']):>8} {r['requests_per_s']:>6.2f} {r['output_tokens_per_s']:>9.1f} "
            f"{r.get('kv_mb_per_s') or 0:>8.0f} {r.get('kv_ms_per_request') or 0:>9.1f}"
        )
    by = {r["setup"]: r for r in rows}
    if len(by) == 2 and by["unified"]["itl_p99"] and by["1p1d"]["itl_p99"]:
        u, p = by["unified"], by["1p1d"]
        lines.append(
            f"1P1D / unified: ITL p99 {p['itl_p99'] / u['itl_p99']:.2f}x, max ITL "
            f"{p['itl_max'] / u['itl_max']:.2f}x, ITL p50 {p['itl_p50'] / u['itl_p50']:.2f}x, "
            f"output tok/s {p['output_tokens_per_s'] / u['output_tokens_per_s']:.2f}x "
            "(times in ms; lower ITL is better)"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    ap.add_argument("--long-every", type=int, default=5, help="every n-th request is a long one")
    ap.add_argument("--long-tokens", type=int, default=8)
    ap.add_argument("--chat-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-total-tokens", type=int, default=32768)
    ap.add_argument("--model-path", default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"unified": [], "1p1d": []}
    for rep in range(args.repeats):
        for setup in ("unified", "1p1d") if rep % 2 == 0 else ("1p1d", "unified"):
            runs[setup].append(run(setup, args, seed=rep))
            print(f"{setup} run {rep + 1}: {runs[setup][-1]['seconds']:.1f} s", flush=True)
    rows = [summarize(s, r) for s, r in runs.items()]
    text = table(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    meta = {"commit": git_commit(), "machine": machine(), "args": vars(args)}
    (RESULTS / "pd.txt").write_text(f"{json.dumps(meta)}\n{text}\n")
    (RESULTS / "pd.json").write_text(json.dumps({**meta, "rows": rows, "runs": runs}, indent=1))
    print(
        f"median run seconds: {statistics.median(r['seconds'] for v in runs.values() for r in v):.1f}"
    )


if __name__ == "__main__":
    main()
