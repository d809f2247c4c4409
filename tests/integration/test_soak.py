"""Soak a real `radixrt serve`: 200 requests from 32 concurrent clients over /generate and
/v1/chat/completions, streamed and not, mixed prompt and output lengths, ~15% abandoned by their
client (stream closed early, or a plain request cancelled), a few regex / json_schema ones, on a pool
small enough to preempt (768 tokens). Nothing is lost (every kept request ends with a finish reason), aborts are
counted by the scheduler, and afterwards a flush gives every KV page back with the integrity check ok.
The server runs the session's tiny random Llama with the default tokenizer (tests/conftest.py): what
is checked is bookkeeping (finish reasons, abort counts, pages, integrity) and grammar-enforced output,
none of it what the weights know. Abandoned requests ask for ABANDONED_MAX_TOKENS, so they are still
running when their client leaves, however fast the model steps.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time

import httpx
import jsonschema
import pytest
from conftest_server import ServerProcess

NUM_REQUESTS = 200
NUM_CLIENTS = 32
REGEX = r"[0-9]{3}-[a-z]{2}"
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}
WORDS = "the quick brown fox jumps over a lazy dog while seven tired owls sing about rain".split()
# What an abandoned request asks for. On the real model (tens of ms a step on 2 cores) the plan's
# 1-24 tokens were mostly still running when their client left (after 2 streamed events, or 0.05-2
# s); the tiny model steps 30-100x faster and would finish most of them first, so fewer aborts, or
# none, would reach the scheduler (the path this soak checks). 400 tokens keep a stream running well
# past its 2nd event at any speed; with the plan's longest prompt (154 tokens with the chat
# template) such a request still fits the 768-token pool.
ABANDONED_MAX_TOKENS = 400


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            "--model-path",
            tiny_model_dir,
            "--max-total-tokens",
            "768",
            "--page-size",
            "16",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("soak"),
    )
    yield srv
    srv.stop()


def info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=60).json()


def make_plan(rng: random.Random) -> list[dict]:
    plan = []
    for i in range(NUM_REQUESTS):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 10, 40, 120])))
        constraint = None if i % 25 else rng.choice(["regex", "json_schema"])
        p = {
            "i": i,
            "route": rng.choice(["/generate", "/v1/chat/completions"]),
            "stream": rng.random() < 0.5,
            "prompt": f"{i}: {prompt}",
            "constraint": constraint,
            "max_tokens": 40 if constraint else rng.choice([1, 2, 8, 16, 24]),
            "abort": None if constraint or rng.random() > 0.15 else rng.uniform(0.05, 2.0),
        }
        if p["abort"] is not None:  # (after the draws: the plan is the one it always was)
            p["max_tokens"] = ABANDONED_MAX_TOKENS
        plan.append(p)
    return plan


def body_of(p: dict, model: str) -> dict:
    extra = {}
    if p["constraint"] == "regex":
        extra = {"regex": REGEX}
    elif p["constraint"] == "json_schema":
        extra = {"json_schema": json.dumps(SCHEMA)}
    sp = {"max_new_tokens": p["max_tokens"], "temperature": 0.7, "seed": p["i"], **extra}
    if p["route"] == "/generate":
        return {"text": p["prompt"], "sampling_params": sp, "stream": p["stream"]}
    if p["constraint"] == "json_schema":
        extra = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA},
            }
        }
    return {
        "model": model,
        "messages": [{"role": "user", "content": p["prompt"]}],
        "max_tokens": p["max_tokens"],
        "temperature": 0.7,
        "seed": p["i"],
        "stream": p["stream"],
        **extra,
    }


def outcome(route: str, last: dict) -> tuple[str, object]:
    """(text, finish reason) from a final non-streamed body or the last streamed chunk."""
    if route == "/generate":
        return last["text"], (last["meta_info"]["finish_reason"] or {}).get("type")
    choice = last["choices"][0]
    return choice.get("message", {}).get("content"), choice["finish_reason"]


async def one(client: httpx.AsyncClient, url: str, model: str, p: dict) -> dict:
    body = body_of(p, model)
    if not p["stream"]:
        call = client.post(url + p["route"], json=body)
        if p["abort"] is not None:
            try:
                await asyncio.wait_for(call, p["abort"])  # cancelled: the connection is dropped
            except asyncio.TimeoutError:
                return {"aborted": True}
            return {"aborted": False, "late": True}
        r = await call
        assert r.status_code == 200, r.text[:300]
        text, reason = outcome(p["route"], r.json())
        return {"aborted": False, "text": text, "finish": reason}
    text, events = "", []
    async with client.stream("POST", url + p["route"], json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            events.append(event)
            if p["route"] != "/generate" and event["choices"]:
                text += event["choices"][0]["delta"].get("content") or ""
            if p["abort"] is not None and len(events) >= 2:
                return {"aborted": True}  # leaving the block closes the stream mid-way
    if p["route"] == "/generate":
        text = events[-1]["text"]
    finals = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    reason = (
        (events[-1]["meta_info"]["finish_reason"] or {}).get("type")
        if p["route"] == "/generate"
        else (finals[-1]["choices"][0]["finish_reason"] if finals else None)
    )
    return {"aborted": False, "text": text, "finish": reason}


def test_soak_nothing_lost_nothing_leaked(server):
    plan = make_plan(random.Random(1234))
    before = info(server)
    model = before["served_model_name"]  # what chat requests name (the tiny model's directory)
    started = time.monotonic()

    async def run() -> list[dict]:
        sem = asyncio.Semaphore(NUM_CLIENTS)
        async with httpx.AsyncClient(
            timeout=600, limits=httpx.Limits(max_connections=NUM_CLIENTS + 8)
        ) as client:

            async def limited(p: dict) -> dict:
                async with sem:
                    return await one(client, server.url, model, p)

            return await asyncio.gather(*[limited(p) for p in plan])

    results = asyncio.run(run())
    elapsed = time.monotonic() - started
    served = [(p, r) for p, r in zip(plan, results) if not r["aborted"]]
    num_aborted = len(plan) - len(served)
    lost = [
        (p["i"], r)
        for p, r in served
        if not r.get("late") and r["finish"] not in ("stop", "length")
    ]
    assert not lost, lost[:5]
    for p, r in served:
        if p["constraint"] == "regex" and r["finish"] == "stop":
            assert re.fullmatch(REGEX, r["text"]), r["text"]
        elif p["constraint"] == "json_schema" and r["finish"] == "stop":
            jsonschema.validate(json.loads(r["text"]), SCHEMA)
    num_constrained_checked = sum(1 for p, r in served if p["constraint"] and r["finish"] == "stop")
    assert num_constrained_checked >= 3

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = info(server)
        if (
            now["num_running"] == 0
            and now["num_waiting"] == 0
            and now["num_inflight_requests"] == 0
        ):
            break
        time.sleep(0.2)
    num_sched_aborted = now["num_requests_aborted"] - before["num_requests_aborted"]
    num_preempted = now["num_preemptions"] - before["num_preemptions"]
    num_finished = now["num_requests_finished"] - before["num_requests_finished"]
    assert num_sched_aborted >= 1 and num_sched_aborted <= num_aborted
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    after = info(server)
    leaked = after["kv_pages_total"] - after["kv_pages_free"]
    print(
        f"\nsoak: {len(plan)} requests in {elapsed:.1f} s from {NUM_CLIENTS} clients: {len(served)} served, "
        f"{num_aborted} abandoned by clients ({num_sched_aborted} aborted in the scheduler), "
        f"{num_finished} finished in the scheduler, {num_preempted} preemptions, "
        f"{num_constrained_checked} constrained outputs validated, {leaked} KV pages leaked"
    )
    assert leaked == 0 and after["integrity_ok"], after["integrity_error"]
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
