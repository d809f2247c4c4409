"""Serving benchmark: Poisson arrivals against `radixrt serve`, radix cache on vs off, in one run.

    python benchmarks/bench_serving.py                    # launches both servers itself
    python benchmarks/bench_serving.py --url http://...   # an already running server only (no side by side)

Workloads: shared-prefix (a ~600-token few-shot prefix + distinct short questions, /v1/completions)
swept over request rates, and multi-turn chat (each turn resends the whole history, /v1/chat/completions).
Reports throughput, p50/p99 time-to-first-token and inter-token latency, and the cache hit rate the
server saw; writes benchmarks/results/bench_serving.{json,png}. Every request streams.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from workloads import QUESTIONS, shared_prefix_prompts  # noqa: E402

from radixrt.frontend.launcher import wait_until_healthy  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TOPICS = ["volcanoes", "the moon", "bread baking", "chess openings", "rainforests", "jazz", "bicycles", "bees"]
FOLLOW_UPS = ["Why is that?", "Give one concrete example.", "Summarize that in one sentence."]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def stream_request(client: httpx.AsyncClient, url: str, path: str, body: dict) -> dict:
    """One streamed request: its text, TTFT, the gaps between content chunks, completion tokens."""
    start = time.perf_counter()
    first, last, gaps, text, tokens = None, None, [], "", 0
    async with client.stream("POST", url + path, json={**body, "stream": True,
                                                       "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                if piece:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
                    text += piece
    end = time.perf_counter()
    return {"text": text, "ttft": (first or end) - start, "gaps": gaps, "tokens": tokens, "latency": end - start}


async def poisson_starts(rate: float, n: int, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if rate != float("inf") else 0.0
    return out


async def run_shared_prefix(url: str, rate: float, num_requests: int, max_tokens: int, seed: int) -> list[dict]:
    prompts = shared_prefix_prompts(num_requests)
    starts = await poisson_starts(rate, num_requests, random.Random(seed))
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=256)) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> dict:
            await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            return await stream_request(client, url, "/v1/completions", {
                "model": "default", "prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True})
        return await asyncio.gather(*[one(i) for i in range(num_requests)])


async def run_multi_turn(url: str, rate: float, num_conversations: int, num_turns: int, max_tokens: int,
                         seed: int) -> list[dict]:
    """Conversations start as a Poisson process; the turns of one conversation run one after another."""
    rng = random.Random(seed)
    starts = await poisson_starts(rate, num_conversations, rng)
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=256)) as client:
        t0 = time.perf_counter()

        async def conversation(i: int) -> list[dict]:
            await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            msgs = [{"role": "system", "content": "You are a knowledgeable, concise assistant."},
                    {"role": "user", "content": f"Tell me something interesting about {TOPICS[i % len(TOPICS)]}. "
                                                f"{QUESTIONS[i % len(QUESTIONS)]}"}]
            out = []
            for turn in range(num_turns):
                res = await stream_request(client, url, "/v1/chat/completions", {
                    "model": "default", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True})
                out.append(res)
                msgs = msgs + [{"role": "assistant", "content": res["text"]}]
                msgs.append({"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]})
            return out
        convs = await asyncio.gather(*[conversation(i) for i in range(num_conversations)])
    return [r for conv in convs for r in conv]


def server_info(url: str) -> dict:
    return httpx.get(url + "/get_server_info", timeout=60).json()


def wait_idle_and_flush(url: str) -> None:
    for _ in range(600):
        info = server_info(url)
        if info["num_running"] == 0 and info["num_waiting"] == 0 and httpx.post(url + "/flush_cache",
                                                                                timeout=60).status_code == 200:
            return
        time.sleep(0.1)
    raise RuntimeError("server did not become idle")


def measure(url: str, workload: str, rate: float, args: argparse.Namespace) -> dict:
    wait_idle_and_flush(url)  # every level starts cold: the prefix is prefilled once per level
    before = server_info(url)
    t0 = time.perf_counter()
    if workload == "shared_prefix":
        results = asyncio.run(run_shared_prefix(url, rate, args.num_requests, args.max_tokens, args.seed))
    else:
        results = asyncio.run(run_multi_turn(url, rate, args.num_conversations, args.num_turns, args.max_tokens,
                                             args.seed))
    elapsed = time.perf_counter() - t0
    after = server_info(url)
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    gaps = [g for r in results for g in r["gaps"]]
    ttfts = [r["ttft"] for r in results]
    return {"workload": workload, "rate": rate, "num_requests": len(results), "seconds": elapsed,
            "output_tokens_per_s": sum(r["tokens"] for r in results) / elapsed,
            "requests_per_s": len(results) / elapsed,
            "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
            "itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
            "latency_p50": percentile([r["latency"] for r in results], 50),
            "cache_hit_rate": (after["cached_tokens"] - before["cached_tokens"]) / prompt if prompt else 0.0}


class LaunchedServer:
    def __init__(self, extra: list[str], args: argparse.Namespace):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "radixrt.cli", "serve", "--port", str(port), "--log-level", "warning",
               "--max-total-tokens", str(args.max_total_tokens), *(["--model-path", args.model_path]
                                                                   if args.model_path else []), *extra]
        self.proc = subprocess.Popen(cmd)
        try:
            wait_until_healthy(self.url, self.proc, 600, poll_s=0.5)
        except (RuntimeError, TimeoutError):
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def run_all(url: str, label: str, args: argparse.Namespace) -> list[dict]:
    rows = []
    for rate in args.rates:
        rows.append({"server": label, **measure(url, "shared_prefix", rate, args)})
        print_row(rows[-1])
    rows.append({"server": label, **measure(url, "multi_turn", args.chat_rate, args)})
    print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    print(f"{r['server']:>9} {r['workload']:>13} rate {r['rate']:5.2f}/s | {r['output_tokens_per_s']:7.1f} tok/s "
          f"{r['requests_per_s']:5.2f} req/s | TTFT p50 {r['ttft_p50']:6.2f} p99 {r['ttft_p99']:6.2f} s | ITL p50 "
          f"{r['itl_p50'] * 1e3:6.1f} p99 {r['itl_p99'] * 1e3:7.1f} ms | cache hit {r['cache_hit_rate']:5.1%}",
          flush=True)


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    panels = [("output_tokens_per_s", "output tokens/s"), ("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"),
              ("itl_p50", "inter-token latency p50 (s)")]
    for ax, (key, title) in zip(axes, panels):
        for label in sorted({r["server"] for r in rows}):
            pts = [(r["rate"], r[key]) for r in rows if r["server"] == label and r["workload"] == "shared_prefix"]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("radixrt serving: shared-prefix workload (~600-token prefix), Poisson arrivals")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="benchmark this running server instead of launching two")
    p.add_argument("--model-path", default=None)
    p.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0], help="shared-prefix request rates")
    p.add_argument("--num-requests", type=int, default=8, help="requests per shared-prefix rate")
    p.add_argument("--chat-rate", type=float, default=0.5, help="multi-turn conversations started per second")
    p.add_argument("--num-conversations", type=int, default=3)
    p.add_argument("--num-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS / "bench_serving"))
    args = p.parse_args()
    started = time.perf_counter()
    rows: list[dict] = []
    if args.url:
        rows += run_all(args.url.rstrip("/"), "server", args)
    else:
        for label, extra in (("radix", []), ("no-cache", ["--disable-radix-cache"])):
            srv = LaunchedServer(extra, args)
            try:
                rows += run_all(srv.url, label, args)
            finally:
                srv.stop()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    plot(rows, out.with_suffix(".png"))
    labels = sorted({r["server"] for r in rows})
    if len(labels) == 2:
        print("\nradix / no-cache, same load:")
        for a in (r for r in rows if r["server"] == "radix"):
            b = next(r for r in rows if r["server"] == "no-cache" and r["workload"] == a["workload"]
                     and r["rate"] == a["rate"])
            print(f"  {a['workload']:>13} rate {a['rate']:5.2f}: throughput x{a['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}"
                  f", TTFT p50 x{b['ttft_p50'] / a['ttft_p50']:.2f} faster, p99 x{b['ttft_p99'] / a['ttft_p99']:.2f} faster")
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.png')} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
