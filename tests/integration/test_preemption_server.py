"""A real `radixrt serve` with a KV pool far too small for its load (384 tokens, page size 16):
24 concurrent greedy requests that together need ~4x the pool all complete, preemption happens
(reported in /get_server_info and /metrics), and every output equals the same prompt run on an
in-process Engine with an ample pool, so preemption is invisible. A request that can never fit the
pool is refused up front with a 400, not queued forever. Server and Engine run the session's tiny
random Llama with the default tokenizer (tests/conftest.py): the truth is our own two configurations
agreeing, which holds for any weights, and ignore_eos fixes every output's length.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from conftest_server import ServerProcess

POOL_TOKENS = 384
PAGE_SIZE = 16
NUM_REQUESTS = 24
MAX_NEW = 40
SP = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
ANIMALS, THINGS = ("cat", "dog", "fox", "owl", "bear", "crow"), ("rain", "maps", "soup", "bells")
PROMPTS = [
    f"Story {i}: once upon a time, a {animal} who loved {thing} went to the"
    for i, (animal, thing) in enumerate([(a, t) for a in ANIMALS for t in THINGS])
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            "--model-path",
            tiny_model_dir,
            "--max-total-tokens",
            str(POOL_TOKENS),
            "--page-size",
            str(PAGE_SIZE),
            "--chunked-prefill-size",
            "128",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("preempt"),
    )
    yield srv
    srv.stop()


def info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=60).json()


def test_tiny_pool_preemption_invisible_in_output(server, tokenizer, tiny_model_dir):
    assert len(PROMPTS) == NUM_REQUESTS
    need = sum(len(tokenizer.encode(p, add_special_tokens=False)) + MAX_NEW for p in PROMPTS)
    assert need > 3 * POOL_TOKENS  # the load really does not fit at once
    before = info(server)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            timeout=900, limits=httpx.Limits(max_connections=64)
        ) as client:
            return await asyncio.gather(
                *[
                    client.post(server.url + "/generate", json={"text": p, "sampling_params": SP})
                    for p in PROMPTS
                ]
            )

    responses = asyncio.run(run())
    assert all(r.status_code == 200 for r in responses), [
        r.text[:300] for r in responses if r.status_code != 200
    ]
    http = [r.json() for r in responses]
    assert all(h["meta_info"]["finish_reason"]["type"] == "length" for h in http)
    assert all(len(h["output_ids"]) == MAX_NEW for h in http)

    after = info(server)
    num_preempted = after["num_preemptions"] - before["num_preemptions"]
    print(
        f"\n{NUM_REQUESTS} requests needing {need} KV tokens on a {POOL_TOKENS}-token pool: "
        f"{num_preempted} preemptions"
    )
    assert num_preempted > 0
    assert after["integrity_ok"], after["integrity_error"]
    metrics = httpx.get(server.url + "/metrics", timeout=60).text
    m = re.search(r"^radixrt:num_preemptions(?:\{[^}]*\})? ([0-9.e+]+)$", metrics, re.M)
    assert m and float(m.group(1)) == after["num_preemptions"]
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    flushed = info(server)
    assert flushed["kv_pages_free"] == flushed["kv_pages_total"] and flushed["integrity_ok"]

    # The independent truth: the same prompts, greedy, on an Engine whose pool holds them all at once.
    from radixrt import Engine

    engine = Engine(
        model_path=tiny_model_dir, dtype="float32", max_total_tokens=8192, page_size=PAGE_SIZE
    )
    try:
        local = engine.generate(PROMPTS, SP)
        assert engine.get_server_info()["num_preemptions"] == 0
    finally:
        engine.shutdown()
    mismatched = [
        i for i, (h, e) in enumerate(zip(http, local)) if h["output_ids"] != e["output_ids"]
    ]
    assert not mismatched, [(PROMPTS[i], http[i]["text"], local[i]["text"]) for i in mismatched[:3]]
    assert [h["text"] for h in http] == [e["text"] for e in local]


def test_request_that_can_never_fit_is_refused_up_front(server):
    body = {
        "text": "Tell me everything.",
        "sampling_params": {"max_new_tokens": POOL_TOKENS, "ignore_eos": True},
    }
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and str(POOL_TOKENS) in err["message"]
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1000,
        },
    )
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded"
    # A long prompt alone (over the pool even with 1 new token)
    long = httpx.post(
        server.url + "/generate",
        timeout=60,
        json={"input_ids": [100] * (POOL_TOKENS + 1), "sampling_params": {"max_new_tokens": 1}},
    )
    assert long.status_code == 400
    assert info(server)["num_waiting"] == 0  # nothing was queued
    ok = httpx.post(
        server.url + "/generate",
        timeout=120,
        json={"text": "Hi", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
    )
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
