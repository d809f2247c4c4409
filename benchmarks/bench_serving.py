"""Serving benchmark: Poisson arrivals against `radixrt serve`, radix cache on vs off, in one run.

    python benchmarks/bench_serving.py                    # launches both servers itself
    python benchmarks/bench_serving.py --url http://...   # an already running server only (no side by side)

Workloads: shared-prefix (a ~600-token few-shot prefix + distinct short questions, /v1/completions)
swept over request rates, and multi-turn chat (each turn resends the whole history, /v1/chat/completions).
Reports throughput, p50/p99 time-to-first-token and inter-token latency, and the cache hit rate the
server saw. Every request streams.

Repeats: both servers are launched once and kept up; each of --repeats runs (default 3) measures every
level on the cache-on server, then on the cache-off one, so the two alternate and a drift in machine
load hits both. Repeat k uses arrival seed --seed + k on both servers (paired). Throughput, req/s and
hit rate are the median of the repeats with the min-max spread.

Percentiles: TTFT and inter-token gaps are pooled over the repeats of a level, and a percentile is
only reported when it has enough samples to be more than the maximum: q needs 100 / (100 - q), so
p99 needs >= 100 samples, else it is printed as "n<100" and stored as null. Inter-token gaps are
plentiful; TTFT has one sample per request, so the defaults were raised modestly (8 -> 34 requests
per shared-prefix rate, 3 -> 12 conversations of 3 turns) so that the default 3 repeats give >= 100
TTFT samples per level (102 and 108). With fewer repeats or requests the TTFT p99 shows as n<100.

Writes benchmarks/results/bench_serving.{txt,json,png}: the table the README quotes, the raw numbers of
every run (per-request TTFT, gaps, latency) with the git commit and the machine, and the plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from run_info import git_commit, machine  # noqa: E402
from workloads import QUESTIONS, shared_prefix_prompts  # noqa: E402

from radixrt.runtime.processes import wait_until_healthy  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TOPICS = [
    "volcanoes",
    "the moon",
    "bread baking",
    "chess openings",
    "rainforests",
    "jazz",
    "bicycles",
    "bees",
]
FOLLOW_UPS = ["Why is that?", "Give one concrete example.", "Summarize that in one sentence."]


def min_samples(q: float) -> int:
    """Below 100 / (100 - q) samples the q-th percentile is just the maximum: p99 needs 100, p50 needs 2."""
    return math.ceil(100 / (100 - q) - 1e-9)


def percentile(xs: list[float], q: float) -> float | None:
    """None (shown as n<N) when xs is too small for q: a p99 of 8 requests would be their max."""
    if len(xs) < min_samples(q):
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def stream_request(client: httpx.AsyncClient, url: str, path: str, body: dict) -> dict:
    """One streamed request: its text, TTFT, the gaps between content chunks, completion tokens."""
    start = time.perf_counter()
    first, last, gaps, text, tokens = None, None, [], "", 0
    async with client.stream(
        "POST", url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
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
    return {
        "text": text,
        "ttft": (first or end) - start,
        "gaps": gaps,
        "tokens": tokens,
        "latency": end - start,
    }


async def poisson_starts(rate: float, n: int, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if rate != float("inf") else 0.0
    return out


async def run_shared_prefix(
    url: str, rate: float, num_requests: int, max_tokens: int, seed: int
) -> list[dict]:
    prompts = shared_prefix_prompts(num_requests)
    starts = await poisson_starts(rate, num_requests, random.Random(seed))
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=256)) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> dict:
            await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            return await stream_request(
                client,
                url,
                "/v1/completions",
                {
                    "model": "default",
                    "prompt": prompts[i],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )

        return await asyncio.gather(*[one(i) for i in range(num_requests)])


async def run_multi_turn(
    url: str, rate: float, num_conversations: int, num_turns: int, max_tokens: int, seed: int
) -> list[dict]:
    """Conversations start as a Poisson process; the turns of one conversation run one after another."""
    rng = random.Random(seed)
    starts = await poisson_starts(rate, num_conversations, rng)
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_connections=256)) as client:
        t0 = time.perf_counter()

        async def conversation(i: int) -> list[dict]:
            await asyncio.sleep(max(0.0, t0 + starts[i] - time.perf_counter()))
            msgs = [
                {"role": "system", "content": "You are a knowledgeable, concise assistant."},
                {
                    "role": "user",
                    "content": f"Tell me something interesting about {TOPICS[i % len(TOPICS)]}. "
                    f"{QUESTIONS[i % len(QUESTIONS)]}",
                },
            ]
            out = []
            for turn in range(num_turns):
                res = await stream_request(
                    client,
                    url,
                    "/v1/chat/completions",
                    {
                        "model": "default",
                        "messages": msgs,
                        "max_tokens": max_tokens,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                )
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
        if (
            info["num_running"] == 0
            and info["num_waiting"] == 0
            and httpx.post(url + "/flush_cache", timeout=60).status_code == 200
        ):
            return
        time.sleep(0.1)
    raise RuntimeError("server did not become idle")


def measure(url: str, workload: str, rate: float, args: argparse.Namespace, seed: int) -> dict:
    """One run of one level: every request's raw numbers, summarized later over the repeats."""
    wait_idle_and_flush(url)  # every level starts cold: the prefix is prefilled once per level
    before = server_info(url)
    t0 = time.perf_counter()
    if workload == "shared_prefix":
        results = asyncio.run(
            run_shared_prefix(url, rate, args.num_requests, args.max_tokens, seed)
        )
    else:
        results = asyncio.run(
            run_multi_turn(url, rate, args.num_conversations, args.num_turns, args.max_tokens, seed)
        )
    elapsed = time.perf_counter() - t0
    after = server_info(url)
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_tokens"] - before["cached_tokens"]
    tokens = sum(r["tokens"] for r in results)
    return {
        "seed": seed,
        "num_requests": len(results),
        "seconds": elapsed,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / elapsed,
        "requests_per_s": len(results) / elapsed,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "ttft_s": [r["ttft"] for r in results],
        "latency_s": [r["latency"] for r in results],
        "itl_gaps_s": [g for r in results for g in r["gaps"]],
    }


SPREAD = ("output_tokens_per_s", "requests_per_s", "cache_hit_rate")


def summarize(server: str, workload: str, rate: float, runs: list[dict]) -> dict:
    """A level over its repeats: throughput figures as median (min-max) of the runs; percentiles over
    the pooled per-request samples, which is what makes >= 100 TTFT samples reachable at all."""
    ttfts = [x for r in runs for x in r["ttft_s"]]
    gaps = [x for r in runs for x in r["itl_gaps_s"]]
    row = {"server": server, "workload": workload, "rate": rate, "repeats": len(runs)}
    for k in SPREAD:
        vals = [r[k] for r in runs]
        row[k], row[k + "_min"], row[k + "_max"] = statistics.median(vals), min(vals), max(vals)
    row.update(
        {
            "ttft_n": len(ttfts),
            "ttft_p50": percentile(ttfts, 50),
            "ttft_p99": percentile(ttfts, 99),
            "itl_n": len(gaps),
            "itl_p50": percentile(gaps, 50),
            "itl_p99": percentile(gaps, 99),
            "latency_p50": percentile([x for r in runs for x in r["latency_s"]], 50),
        }
    )
    return row


class LaunchedServer:
    def __init__(self, extra: list[str], args: argparse.Namespace):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "radixrt.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--max-total-tokens",
            str(args.max_total_tokens),
            *(["--model-path", args.model_path] if args.model_path else []),
            *extra,
        ]
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


def levels(args: argparse.Namespace) -> list[tuple[str, float]]:
    return [("shared_prefix", rate) for rate in args.rates] + [("multi_turn", args.chat_rate)]


def fmt(x: float | None, scale: float = 1.0, spec: str = ".2f", n: int = 0) -> str:
    return f"n<{n}" if x is None else format(x * scale, spec)


def table(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"median of {args.repeats} runs (min-max) for throughput and hit rate; TTFT / ITL percentiles over all "
        f"runs' samples pooled (n = samples), p99 only from >= {min_samples(99)} samples; "
        f"{args.max_tokens} new tokens per request",
        "| server | workload | rate /s | out tok/s | req/s | TTFT p50 s | TTFT p99 s | TTFT n | ITL p50 ms "
        "| ITL p99 ms | ITL n | cache hit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['server']} | {r['workload']} | {r['rate']:.2f} | {r['output_tokens_per_s']:.1f} "
            f"({r['output_tokens_per_s_min']:.1f}-{r['output_tokens_per_s_max']:.1f}) | {r['requests_per_s']:.2f} "
            f"({r['requests_per_s_min']:.2f}-{r['requests_per_s_max']:.2f}) | {fmt(r['ttft_p50'], n=2)} "
            f"| {fmt(r['ttft_p99'], n=100)} | {r['ttft_n']} | {fmt(r['itl_p50'], 1e3, '.1f', 2)} "
            f"| {fmt(r['itl_p99'], 1e3, '.1f', 100)} | {r['itl_n']} | {r['cache_hit_rate']:.1%} "
            f"({r['cache_hit_rate_min']:.1%}-{r['cache_hit_rate_max']:.1%}) |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> str:
    """radix over no-cache at the same load; TTFT ratios only where both sides have the percentile."""
    out = ["radix / no-cache, same load (medians):"]
    for a in (r for r in rows if r["server"] == "radix"):
        b = next(
            r
            for r in rows
            if r["server"] == "no-cache"
            and r["workload"] == a["workload"]
            and r["rate"] == a["rate"]
        )
        ttft = [
            f"TTFT {k[5:]} x{b[k] / a[k]:.2f} faster"
            if a[k] and b[k]
            else f"TTFT {k[5:]} n/a (too few samples)"
            for k in ("ttft_p50", "ttft_p99")
        ]
        out.append(
            f"  {a['workload']:>13} rate {a['rate']:5.2f}: throughput "
            f"x{a['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}, " + ", ".join(ttft)
        )
    return "\n".join(out)


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    panels = [
        ("output_tokens_per_s", "output tokens/s (median, min-max bars)"),
        ("ttft_p50", "TTFT p50 (s)"),
        ("ttft_p99", "TTFT p99 (s; only from >= 100 samples)"),
        ("itl_p50", "inter-token latency p50 (s)"),
    ]
    for ax, (key, title) in zip(axes, panels):
        for label in sorted({r["server"] for r in rows}):
            # a percentile with too few samples is None: left out, not drawn as a number it is not
            pts = [
                r
                for r in rows
                if r["server"] == label and r["workload"] == "shared_prefix" and r[key] is not None
            ]
            xs, ys = [r["rate"] for r in pts], [r[key] for r in pts]
            if key + "_min" in rows[0]:
                err = [
                    [y - r[key + "_min"] for y, r in zip(ys, pts)],
                    [r[key + "_max"] - y for y, r in zip(ys, pts)],
                ]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
            else:
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"radixrt serving: shared-prefix workload (~600-token prefix), Poisson arrivals, "
        f"{rows[0]['repeats']} repeats"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", help="benchmark this running server instead of launching two")
    p.add_argument("--model-path", default=None)
    p.add_argument(
        "--rates", type=float, nargs="+", default=[0.5, 2.0], help="shared-prefix request rates"
    )
    p.add_argument(
        "--num-requests",
        type=int,
        default=34,
        help="requests per shared-prefix rate and repeat (34 x 3 repeats >= 100 TTFT samples)",
    )
    p.add_argument(
        "--chat-rate", type=float, default=0.5, help="multi-turn conversations started per second"
    )
    p.add_argument(
        "--num-conversations",
        type=int,
        default=12,
        help="per repeat (12 x 3 turns x 3 repeats >= 100 TTFT samples)",
    )
    p.add_argument("--num-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of every level on every server (median, min-max)",
    )
    p.add_argument("--seed", type=int, default=0, help="repeat k uses arrival seed SEED + k")
    p.add_argument("--out", default=str(RESULTS / "bench_serving"))
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.repeats < 3:
        print(
            f"note: --repeats {args.repeats}: a median of fewer than 3 runs is not a headline figure",
            file=sys.stderr,
        )
    started = time.perf_counter()
    meta = {"commit": git_commit(), "machine": machine()}
    servers: dict[str, str] = {}
    launched: list[LaunchedServer] = []
    runs: dict[tuple[str, str, float], list[dict]] = {}
    try:
        if args.url:
            servers["server"] = args.url.rstrip("/")
        else:
            # both up for the whole run, so their runs can alternate; an idle server blocks in a zmq poll
            for label, extra in (("radix", []), ("no-cache", ["--disable-radix-cache"])):
                launched.append(srv := LaunchedServer(extra, args))
                servers[label] = srv.url
        for rep in range(args.repeats):
            for (
                label,
                url,
            ) in servers.items():  # alternating: every level on one server, then the other
                for workload, rate in levels(args):
                    r = measure(url, workload, rate, args, args.seed + rep)
                    runs.setdefault((label, workload, rate), []).append(r)
                    print(
                        f"repeat {rep + 1} {label:>9} {workload:>13} rate {rate:5.2f}/s | "
                        f"{r['output_tokens_per_s']:7.1f} tok/s {r['requests_per_s']:5.2f} req/s | "
                        f"{r['seconds']:6.1f} s | cache hit {r['cache_hit_rate']:5.1%}",
                        flush=True,
                    )
    finally:
        for srv in launched:
            srv.stop()
    rows = [summarize(label, workload, rate, rs) for (label, workload, rate), rs in runs.items()]
    text = table(rows, args)
    if {r["server"] for r in rows} == {"radix", "no-cache"}:
        text += "\n\n" + ratios(rows)
    print("\n" + text)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(text + "\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                **meta,
                "args": vars(args),
                "repeats": args.repeats,
                "order": "per repeat: every level on "
                + ", then ".join(servers)
                + "; repeat k uses seed + k",
                "rows": rows,
                "runs": [
                    {"server": label, "workload": workload, "rate": rate, "runs": rs}
                    for (label, workload, rate), rs in runs.items()
                ],
            },
            indent=1,
        )
    )
    plot(rows, out.with_suffix(".png"))
    print(
        f"\nwrote {out.with_suffix('.txt')}, .json and .png in {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
