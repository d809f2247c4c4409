"""The tenant battery: one real server, two salts and two clients (two loopback addresses), without
--enable-cache-report. Truth: prompt_tokens from the server's own tokenizer (so the exact cache hit
of a repeated prompt is prompt_tokens - 1 at page size 1, and what a client is told is that rounded
down to 64), the status codes and the error bodies' fields, and the scheduler's accounting in
/get_server_info once the requests ended.
- salt A's prompt gives salt B (and the unsalted) no hit, on /generate and both OpenAI routes; a
  salt's own repeat is a hit, reported in whole 64-token blocks;
- a bad cache_salt is a 400 naming it;
- a client past its share of the in-flight requests (the default: half of running + queued) gets
  a 429 naming the limit while the other client is served at once; past running + queued every
  client gets the 503; the long requests end at --request-timeout, their pages back in the pool.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest_server import ServerProcess

# about 150 tokens: two whole 64-token blocks and a part
SHARED = "Tenant A keeps this system prompt to itself and asks about it often. " * 10
TIMEOUT_S = 15  # the long requests end here; the short ones finish far sooner even on a busy box
LONG = {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(
        [
            "--max-running-requests",
            "4",
            "--max-queued-requests",
            "2",  # in flight at most 6, a client at most 3 (the default share)
            "--request-timeout",
            str(TIMEOUT_S),
            "--no-enable-cache-report",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("tenants"),
    )
    generate(srv, "warm up")  # a fresh server's first forward is slow: keep it off the timings
    yield srv
    srv.stop()


def generate(server, text, salt=None, **params):
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0, **params}}
    if salt is not None:
        body["cache_salt"] = salt
    return httpx.post(server.url + "/generate", json=body, timeout=120)


def cached_and_prompt(server, text, salt=None) -> tuple[int, int]:
    meta = generate(server, text, salt).json()["meta_info"]
    return meta["cached_tokens"], meta["prompt_tokens"]


def info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=60).json()


def test_a_salts_prompt_is_no_hit_for_another_salt(server):
    first, prompt_tokens = cached_and_prompt(server, SHARED, "salt-a")
    assert first == 0 and prompt_tokens > 128
    assert cached_and_prompt(server, SHARED, "salt-b")[0] == 0, "salt B was served salt A's KV"
    assert cached_and_prompt(server, SHARED)[0] == 0, "an unsalted request got salt A's KV"
    again, _ = cached_and_prompt(server, SHARED, "salt-a")
    # the exact hit is every prompt token but the last (page size 1); told in 64-token blocks
    assert again == (prompt_tokens - 1) // 64 * 64 > 0


def openai_usage(server, path, extra, salt) -> tuple[int, int]:
    body = {"model": "default", "max_tokens": 1, "temperature": 0, **extra, "cache_salt": salt}
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


@pytest.mark.parametrize(
    "path, extra",
    [
        ("/v1/completions", {"prompt": SHARED + "Completions."}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": SHARED + "Chat."}]}),
    ],
)
def test_the_openai_routes_take_the_salt_and_report_granular_usage(server, path, extra):
    assert openai_usage(server, path, extra, "salt-c")[0] == 0
    assert openai_usage(server, path, extra, "salt-d")[0] == 0, "salt D was served salt C's KV"
    cached, prompt_tokens = openai_usage(server, path, extra, "salt-c")
    assert cached == (prompt_tokens - 1) // 64 * 64 > 0


@pytest.mark.parametrize("salt", ["", "x" * 257, 5])
def test_a_bad_salt_is_a_400_naming_it(server, salt):
    for path, body in (
        ("/generate", {"text": "hi", "cache_salt": salt}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "cache_salt": salt}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "cache_salt": salt},
        ),
    ):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", (path, r.text)


async def _post(client, server, text, salt=None, params=LONG) -> httpx.Response:
    body = {"text": text, "sampling_params": params}
    if salt is not None:
        body["cache_salt"] = salt
    return await client.post(server.url + "/generate", json=body)


def _client(address: str) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address)  # another client by its address
    return httpx.AsyncClient(transport=transport, timeout=60)


async def _ended_at(request) -> tuple[httpx.Response, float]:
    """request's response and the moment it came."""
    r = await request
    return r, time.monotonic()


def test_a_greedy_client_gets_429_the_other_is_served_and_the_timeout_ends_it_all(server):
    async def scenario():
        async with _client("127.0.0.2") as greedy, _client("127.0.0.1") as other:
            held = [
                asyncio.create_task(_ended_at(_post(greedy, server, f"greedy {i}")))
                for i in range(3)
            ]
            await asyncio.sleep(1.0)
            refused = await _post(greedy, server, "greedy 4")
            t0 = time.monotonic()
            served, served_at = await _ended_at(
                _post(other, server, "Hello", params={"max_new_tokens": 2})
            )
            served_s = served_at - t0
            # the rest of what may be in flight (6): the other client's 2 and one more salt's 1
            more = [asyncio.create_task(_post(other, server, f"other {i}")) for i in range(2)]
            more.append(asyncio.create_task(_post(greedy, server, "salted", "salt-e")))
            await asyncio.sleep(1.0)
            overloaded = await _post(other, server, "one too many", "salt-f")
            held_done = await asyncio.gather(*held)
            held_ended_at = [at for _, at in held_done]
            ended = [r for r, _ in held_done] + list(await asyncio.gather(*more))
            return refused, served, served_s, served_at, held_ended_at, overloaded, ended

    refused, served, served_s, served_at, held_ended_at, overloaded, ended = asyncio.run(scenario())
    error = refused.json()["error"]
    assert refused.status_code == 429 and "max_requests_per_client" in error["message"], error
    # served while the greedy client holds its share: answered before any of its held requests
    # ended (they end only at the TIMEOUT_S request timeout, checked below), not queued behind them
    assert served.status_code == 200, served.text
    assert served_at < min(held_ended_at), (served_s, [at - served_at for at in held_ended_at])
    assert overloaded.status_code == 503, overloaded.text
    assert overloaded.json()["error"]["type"] == "server_overloaded"
    # every long request ended at the timeout, far short of its 4000 tokens
    for r in ended:
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert "timed out" in meta["finish_reason"]["message"]
        assert meta["completion_tokens"] < LONG["max_new_tokens"]
    deadline = time.monotonic() + 20
    while (i := info(server))["num_running"] or i["num_waiting"]:
        assert time.monotonic() < deadline, i
        time.sleep(0.2)
    # aborted at the timeout: no page held by a request (free, or cached and evictable)
    assert i["kv_pages_free"] + i["kv_pages_evictable"] == i["kv_pages_total"], i
    assert i["integrity_ok"], i
