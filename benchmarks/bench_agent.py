"""Agent loop under memory pressure, with and without sessions, side by side in one run.

    python benchmarks/bench_agent.py [--turns 8] [--repeats 3] [--max-total-tokens 3072]

One `radixrt serve` (default config, a small KV pool so other traffic evicts what is not pinned). An
agent makes --turns tool-calling turns through /v1/chat/completions (tool_choice required: every turn is a
grammar-constrained call), appends the call and the tool's result to its messages, and between turns
other clients send unrelated long prompts that fill the pool. The same agent runs with a session_id (its
last turn stays pinned) and without; runs alternate, --repeats times. Reports per mode the median turn
latency (turns 2.., the first is cold in both), the cached prompt tokens per turn, and the hit rate.
Writes benchmarks/results/agent.{json,txt}.
"""

from __future__ import annotations

import argparse
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
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a fact up in the encyclopedia",
            "parameters": {
                "type": "object",
                "properties": {
                    "topic": {"type": "string", "maxLength": 24},
                    "detail": {"enum": ["short", "long"]},
                },
                "required": ["topic", "detail"],
                "additionalProperties": False,
            },
        },
    }
]
TOPICS = [
    "volcanoes",
    "the moon",
    "bread",
    "chess",
    "rivers",
    "bees",
    "glaciers",
    "comets",
    "tea",
    "bridges",
]


def filler(client: httpx.Client, i: int) -> None:
    text = f"Unrelated document {i}. " + " ".join(f"word{(i * 7 + k) % 997}" for k in range(260))
    client.post(
        "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}}
    ).raise_for_status()


def agent(client: httpx.Client, turns: int, session: str | None, run: int) -> list[dict]:
    msgs = [
        {
            "role": "system",
            "content": "You are a research agent. Use the lookup tool for every question.",
        },
        {"role": "user", "content": f"Research run {run}: tell me about {TOPICS[0]}."},
    ]
    out = []
    for turn in range(turns):
        body = {
            "model": "default",
            "messages": msgs,
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": 48,
            "temperature": 0,
        }
        if session is not None:
            body["session_id"] = session
        t0 = time.perf_counter()
        r = client.post("/v1/chat/completions", json=body)
        seconds = time.perf_counter() - t0
        r.raise_for_status()
        data = r.json()
        message = data["choices"][0]["message"]
        usage = data["usage"]
        out.append(
            {
                "turn": turn,
                "seconds": seconds,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "finish_reason": data["choices"][0]["finish_reason"],
            }
        )
        call = (message.get("tool_calls") or [{}])[0]
        msgs.append(
            {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": message.get("tool_calls"),
            }
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": call.get("id", "none"),
                "content": json.dumps(
                    {"result": f"Facts about {TOPICS[(turn + 1) % len(TOPICS)]}: " + "x" * 40}
                ),
            }
        )
        msgs.append({"role": "user", "content": f"Now look up {TOPICS[(turn + 1) % len(TOPICS)]}."})
        for i in range(3):  # other traffic between turns: fills the pool
            filler(client, 1000 * run + 10 * turn + i)
    if session is not None:
        client.post("/close_session", json={"session_id": session}).raise_for_status()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-total-tokens", type=int, default=3072)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
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
        ]
    )
    runs: dict[str, list[list[dict]]] = {"session": [], "no session": []}
    try:
        wait_until_healthy(url, server, 600)
        with httpx.Client(base_url=url, timeout=600) as client:
            agent(client, 2, None, -1)  # warm-up
            for k in range(args.repeats):
                for mode in runs:
                    client.post("/flush_cache")
                    runs[mode].append(
                        agent(client, args.turns, f"agent-{k}" if mode == "session" else None, k)
                    )
    finally:
        server.terminate()
        server.wait(60)
    lines = [
        f"agent loop: {args.turns} tool-calling turns (tool_choice required), 3 unrelated ~1,000-token "
        f"requests between turns, pool {args.max_total_tokens} tokens; median over turns 2..{args.turns} of "
        f"{args.repeats} alternating runs\n",
        "| mode | turn latency p50 (s) | cached tokens per turn (median) | prompt tokens per turn (median) | "
        "hit rate | calls valid |",
        "|---|---|---|---|---|---|",
    ]
    summary = {}
    for mode, rs in runs.items():
        later = [t for r in rs for t in r[1:]]
        hit = sum(t["cached_tokens"] for t in later) / sum(t["prompt_tokens"] for t in later)
        summary[mode] = {
            "latency_p50": statistics.median(t["seconds"] for t in later),
            "cached_p50": statistics.median(t["cached_tokens"] for t in later),
            "prompt_p50": statistics.median(t["prompt_tokens"] for t in later),
            "hit_rate": hit,
            "calls": sum(t["finish_reason"] == "tool_calls" for r in rs for t in r),
            "turns": sum(len(r) for r in rs),
        }
        s = summary[mode]
        lines.append(
            f"| {mode} | {s['latency_p50']:.3f} | {s['cached_p50']:.0f} | {s['prompt_p50']:.0f} | "
            f"{100 * hit:.1f}% | {s['calls']}/{s['turns']} |"
        )
    ratio = summary["no session"]["latency_p50"] / summary["session"]["latency_p50"]
    lines.append(f"\nturn latency without / with sessions: {ratio:.2f}x")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "agent.txt").write_text(text + "\n")
    (RESULTS / "agent.json").write_text(
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
