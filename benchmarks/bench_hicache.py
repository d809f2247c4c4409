"""The second cache tier (--enable-hierarchical-cache), side by side in one run: tier off, in host memory, in a
file on local disk. Each configuration is a real `radixrt serve` (HTTP, the default model and dtype).

    python benchmarks/bench_hicache.py [--conversations 64] [--turns 4] [--pool-tokens 0] [--only chat|fewshot]

Multi-turn chat: --conversations chats (a shared system prompt, then each its own topic), --turns turns each.
--clients threads play them round-robin, one turn per request, so a conversation comes back only after every
other one has had a turn: its history has been pushed out of the pool, whose size is a quarter of all the
histories (--pool-tokens overrides). Per configuration: turn latency p50/p99, prompt tokens computed
(prompt - cached, the server's counters), output tokens/s, wall time, and the tier's own figures (tokens
loaded and written, load latency).
Few-shot: 8 large documents (~600 tokens each), a question about each in turn, cycled --rounds times through a
pool that holds about two of them: without the tier every question recomputes its document.
Outputs of the configurations are compared (greedy): with --dtype float32 they are equal token for token (the
tier copies KV bytes exactly; in the default bf16 a prefix loaded back instead of recomputed in another chunking
can flip a near-tie, as any radix cache hit can, so the count of identical outputs is printed).
Then the copy costs behind the scheduler's constants (core/tiered_cache.MIN_SWAP_TOKENS,
schedule_policy.TIER_LOAD_TOKENS_PER_BUDGET_TOKEN): microseconds per token to write and load, against the
prefill cost per token measured in the same run.
Raw results: benchmarks/results/hicache.json; the table: results/hicache.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from bench_grammar import pct  # noqa: E402
from run_info import git_commit, machine  # noqa: E402

from radixrt.frontend.launcher import Runtime  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SYSTEM = (
    "You are a patient assistant for a travel company. You answer questions about trips, bookings and "
    "destinations. Keep answers short, friendly and factual. "
) * 2
TOPICS = ["Lisbon", "Kyoto", "Patagonia", "Iceland", "Morocco", "Vancouver", "Sicily", "Bhutan"]
DOC = (
    "Document {d}. Field notes from expedition {d}: the team recorded weather, terrain, supplies and the "
    "condition of every trail between camp {d} and the northern ridge. "
)


def generate(client: httpx.Client, url: str, text: str, max_new: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = client.post(
        url + "/generate",
        json={
            "text": text,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
        },
        timeout=600,
    )
    r.raise_for_status()
    return r.json(), time.perf_counter() - t0


def chat(url: str, args: argparse.Namespace) -> dict:
    """Round-robin multi-turn chat; returns latencies and outputs in a fixed order."""
    histories = [
        f"{SYSTEM}Customer {c} plans a trip to {TOPICS[c % len(TOPICS)]} number {c}. "
        for c in range(args.conversations)
    ]
    outputs: dict[tuple[int, int], list[int]] = {}
    latencies: list[float] = []
    lock = threading.Lock()
    order = [(t, c) for t in range(args.turns) for c in range(args.conversations)]
    next_job = iter(order)
    done = {c: -1 for c in range(args.conversations)}
    cond = threading.Condition(lock)

    def worker() -> None:
        with httpx.Client() as client:
            while True:
                with lock:
                    job = next(next_job, None)
                    if job is None:
                        return
                    t, c = job
                    while done[c] != t - 1:  # a conversation's turns run in order
                        cond.wait()
                    histories[c] += (
                        f"Customer: question {t} about {TOPICS[c % len(TOPICS)]}: what should I "
                        f"pack, and how do I get from the airport to the centre? Assistant:"
                    )
                    text = histories[c]
                out, seconds = generate(client, url, text, args.max_new_tokens)
                with lock:
                    histories[c] += out["text"] + "\n"
                    outputs[(c, t)] = out["output_ids"]
                    latencies.append(seconds)
                    done[c] = t
                    cond.notify_all()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {
        "wall_s": time.perf_counter() - t0,
        "latencies": latencies,
        "outputs": [outputs[k] for k in sorted(outputs)],
        "history_chars": sum(map(len, histories)),
    }


def fewshot(url: str, args: argparse.Namespace) -> dict:
    docs = [DOC.format(d=d) * 18 for d in range(8)]
    latencies, outputs = [], []
    t0 = time.perf_counter()
    with httpx.Client() as client:
        for r in range(args.rounds):
            for d, doc in enumerate(docs):
                out, seconds = generate(
                    client,
                    url,
                    f"{doc}\nQuestion {r}: summarise document {d} in one line.",
                    args.max_new_tokens,
                )
                latencies.append(seconds)
                outputs.append(out["output_ids"])
    return {"wall_s": time.perf_counter() - t0, "latencies": latencies, "outputs": outputs}


def run_config(
    name: str, tier_args: dict, workload, pool_tokens: int, args: argparse.Namespace
) -> dict:
    rt = Runtime(
        max_total_tokens=pool_tokens, page_size=args.page_size, dtype=args.dtype, **tier_args
    )
    try:
        info0 = httpx.get(rt.url + "/get_server_info").json()
        res = workload(rt.url, args)
        info = httpx.get(rt.url + "/get_server_info").json()
    finally:
        rt.shutdown()
    lat = res["latencies"]
    out_tokens = sum(len(o) for o in res["outputs"])
    row = {
        "config": name,
        "requests": len(lat),
        "latency_p50_s": pct(lat, 0.5),
        "latency_p99_s": pct(lat, 0.99),
        "prompt_tokens": info["prompt_tokens"] - info0["prompt_tokens"],
        "computed_tokens": (info["prompt_tokens"] - info["cached_tokens"])
        - (info0["prompt_tokens"] - info0["cached_tokens"]),
        "output_tok_s": out_tokens / res["wall_s"],
        "wall_s": res["wall_s"],
        "preemptions": info["num_preemptions"],
        "outputs": res["outputs"],
    }
    for key in (
        "hicache_tokens_loaded",
        "hicache_tokens_written",
        "hicache_hits",
        "hicache_load_latency_p50_s",
        "hicache_load_latency_p99_s",
        "hicache_bytes_loaded",
        "hicache_checksum_failures",
        "kv_bytes_per_token",
    ):
        row[key] = info.get(key)
    return row


def table(title: str, rows: list[dict]) -> str:
    lines = [
        f"== {title} ==",
        f"{'tier':>10} {'turns':>6} {'p50 s':>7} {'p99 s':>7} {'computed':>9} {'of prompt':>9} "
        f"{'out tok/s':>9} {'wall s':>7} {'loaded':>8} {'written':>8} {'load p50 ms':>11} {'preempt':>7}",
    ]
    for r in rows:
        p50 = r["hicache_load_latency_p50_s"]
        lines.append(
            f"{r['config']:>10} {r['requests']:6d} {r['latency_p50_s']:7.3f} {r['latency_p99_s']:7.3f} "
            f"{r['computed_tokens']:9d} {r['prompt_tokens']:9d} {r['output_tok_s']:9.1f} {r['wall_s']:7.1f} "
            f"{r['hicache_tokens_loaded'] or 0:8d} {r['hicache_tokens_written'] or 0:8d} "
            f"{(p50 or 0) * 1e3:11.2f} {r['preemptions']:7d}"
        )
    base = rows[0]
    for r in rows[1:]:
        lines.append(
            f"  {r['config']} vs off: computed {r['computed_tokens'] / max(base['computed_tokens'], 1):.2f}x, "
            f"p50 {base['latency_p50_s'] / r['latency_p50_s']:.2f}x faster, p99 "
            f"{base['latency_p99_s'] / r['latency_p99_s']:.2f}x, throughput "
            f"{r['output_tok_s'] / base['output_tok_s']:.2f}x; outputs identical to off: "
            f"{sum(a == b for a, b in zip(r['outputs'], base['outputs']))}/{len(base['outputs'])}"
        )
    return "\n".join(lines)


def copy_costs(args: argparse.Namespace) -> dict:
    """µs per token to write to / load from each tier vs prefill µs per token, in-process (the default model)."""
    from radixrt import Engine
    from radixrt.runtime.model.kv_tier import KVTierStore

    engine = Engine(max_total_tokens=4096, page_size=args.page_size)
    try:
        runner = engine.scheduler.runner
        prompt = DOC.format(d=1) * 20
        engine.generate(prompt, {"max_new_tokens": 1})
        engine.flush_cache()
        t0 = time.perf_counter()
        out = engine.generate(prompt, {"max_new_tokens": 1})
        prefill_us = (time.perf_counter() - t0) / out["meta_info"]["prompt_tokens"] * 1e6
        n = 1024 // args.page_size
        costs = {"prefill_us_per_token": prefill_us}
        with tempfile.TemporaryDirectory() as d:
            for name, directory in (("host", None), ("file", d)):
                store = KVTierStore(runner.kv, args.page_size, n, {"bench": 1}, directory)
                pages = list(range(n))
                for label, fn in (
                    ("write", lambda s=store, p=pages: s.write(p, p)),
                    ("load", lambda s=store, p=pages: s.read(p, p)),
                ):
                    fn()
                    t0 = time.perf_counter()
                    fn()
                    costs[f"{name}_{label}_us_per_token"] = (
                        (time.perf_counter() - t0) / (n * args.page_size) * 1e6
                    )
                t0 = time.perf_counter()
                store.write(pages[:1], pages[:1])
                store.read(pages[:1], pages[:1])
                costs[f"{name}_one_page_round_trip_us"] = (time.perf_counter() - t0) * 1e6
                store.close()
    finally:
        engine.shutdown()
    return costs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="few-shot: passes over the 8 documents")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument(
        "--pool-tokens", type=int, default=0, help="chat pool; default a quarter of all histories"
    )
    ap.add_argument("--fewshot-pool-tokens", type=int, default=1600)
    ap.add_argument("--only", choices=["chat", "fewshot"], default=None)
    ap.add_argument(
        "--hicache-ratio",
        type=float,
        default=4.0,
        help="tier size x the pool: 4 holds the chat histories and the 8 documents",
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="float32: outputs token-identical with the tier on and off "
        "(in bf16 a prefix loaded back instead of recomputed in a different chunking can flip a "
        "near-tie, as a plain radix cache hit can)",
    )
    args = ap.parse_args()
    disk = tempfile.mkdtemp(prefix="radixrt-bench-hicache-")
    tier = {"enable_hierarchical_cache": True, "hicache_ratio": args.hicache_ratio}
    configs = [
        ("off", {}),
        ("host", tier),
        ("disk", {**tier, "hicache_storage_backend": "file", "hicache_storage_dir": disk}),
    ]
    # each conversation's final history in tokens: system ~50, opener ~12, per turn ~25 question + output
    history_tokens = 62 + args.turns * (27 + args.max_new_tokens)
    chat_pool = args.pool_tokens or args.conversations * history_tokens // 4
    report = {
        "commit": git_commit(),
        "machine": machine(),
        "args": vars(args),
        "chat_pool_tokens": chat_pool,
    }
    text = []
    if args.only in (None, "chat"):
        rows = [run_config(n, t, chat, chat_pool, args) for n, t in configs]
        report["chat"] = rows
        text.append(
            table(
                f"multi-turn chat: {args.conversations} conversations x {args.turns} turns, pool "
                f"{chat_pool} tokens (~1/4 of the histories), {args.clients} clients",
                rows,
            )
        )
        print(text[-1], flush=True)
    if args.only in (None, "fewshot"):
        rows = [run_config(n, t, fewshot, args.fewshot_pool_tokens, args) for n, t in configs]
        report["fewshot"] = rows
        text.append(
            table(
                f"few-shot: 8 documents x {args.rounds} rounds through a pool of "
                f"{args.fewshot_pool_tokens} tokens",
                rows,
            )
        )
        print(text[-1], flush=True)
    costs = copy_costs(args)
    report["copy_costs"] = costs
    text.append(
        "== copy costs (µs per token; page size %d) ==\n" % args.page_size
        + "\n".join(f"  {k}: {v:.1f}" for k, v in costs.items())
    )
    print(text[-1])
    RESULTS.mkdir(exist_ok=True)
    suffix = "" if args.only is None else f"_{args.only}"
    (RESULTS / f"hicache{suffix}.json").write_text(json.dumps(report, indent=1))
    (RESULTS / f"hicache{suffix}.txt").write_text(
        f"commit {report['commit']}\n" + "\n\n".join(text) + "\n"
    )


if __name__ == "__main__":
    main()
