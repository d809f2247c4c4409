"""One request must never take the server down: hostile inputs against a launched server. Every input
gets its 4xx naming the problem; after each the server is healthy and a plain request still works;
at the end no page leaked and the integrity check holds. Then a storm of explosive grammar
compiles: /health keeps answering fast and a plain request keeps its normal speed. The server runs
the session's tiny random Llama with the default tokenizer (tests/conftest.py): the refusals, the
health and the bookkeeping do not depend on what the weights know (a plain request's 8 greedy tokens
are counted, never read), and the plain request after each input costs a fraction of the real
model's time."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess

# below the tiny model's 4,096-token context, so "a prompt longer than the pool" (POOL_TOKENS + 10
# tokens) is refused by the pool check, not the context check (the real model's context is 8,192)
POOL_TOKENS = 2048
COMPILE_TIMEOUT_S = 3
PLAIN = {
    "text": "The capital of France is",
    "sampling_params": {"max_new_tokens": 8, "temperature": 0},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            "--model-path",
            tiny_model_dir,
            "--max-total-tokens",
            str(POOL_TOKENS),
            "--grammar-compile-timeout",
            str(COMPILE_TIMEOUT_S),
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("hardening"),
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


def sp(**kw) -> dict:
    return {"text": "Hello", "sampling_params": {"max_new_tokens": 4, **kw}}


BIG = 2**70
OK_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
deep = {"type": "integer"}
for _ in range(40):
    deep = {"type": "object", "properties": {"x": deep}}
ONE_OF_ENUMS = {"oneOf": [{"enum": [f"v{i}_{j}" for j in range(64)]} for i in range(64)]}

# (label, route, body as dict or raw bytes, extra headers, allowed statuses, word the error must contain)
HOSTILE = [
    (
        "stop id past the vocab with min_new_tokens",
        "/generate",
        sp(min_new_tokens=2, stop_token_ids=[999999]),
        {},
        {400},
        "stop_token_ids",
    ),
    (
        "temperature 1e-300 with top_k",
        "/generate",
        sp(temperature=1e-300, top_k=5),
        {},
        {400},
        "temperature",
    ),
    (
        "repetition_penalty 1e-300 with top_p",
        "/generate",
        sp(repetition_penalty=1e-300, top_p=0.5),
        {},
        {400},
        "repetition_penalty",
    ),
    ("max_new_tokens 2^70", "/generate", sp(max_new_tokens=BIG), {}, {400}, "max_new_tokens"),
    (
        "max_new_tokens past the context",
        "/generate",
        sp(max_new_tokens=10**6),
        {},
        {400},
        "max_tokens",
    ),
    ("top_k 2^70", "/generate", sp(top_k=BIG), {}, {400}, "top_k"),
    ("stop id 2^70", "/generate", sp(stop_token_ids=[BIG]), {}, {400}, "stop_token_ids"),
    (
        "temperature NaN",
        "/generate",
        b'{"text":"hi","sampling_params":{"temperature":NaN}}',
        {},
        {400},
        "",
    ),
    (
        "temperature Infinity",
        "/generate",
        b'{"text":"hi","sampling_params":{"temperature":Infinity}}',
        {},
        {400},
        "",
    ),
    (
        "temperature 1e309",
        "/generate",
        b'{"text":"hi","sampling_params":{"temperature":1e309}}',
        {},
        {400},
        "",
    ),
    ("top_p 0", "/generate", sp(top_p=0), {}, {400}, "top_p"),
    ("top_p 1.5", "/generate", sp(top_p=1.5), {}, {400}, "top_p"),
    ("min_p -1", "/generate", sp(min_p=-1), {}, {400}, "min_p"),
    ("frequency_penalty 3", "/generate", sp(frequency_penalty=3), {}, {400}, "frequency_penalty"),
    (
        "repetition_penalty 0",
        "/generate",
        sp(repetition_penalty=0),
        {},
        {400},
        "repetition_penalty",
    ),
    ("n 0", "/generate", sp(n=0), {}, {400}, "n"),
    ("n 17", "/generate", sp(n=17), {}, {400}, "n"),
    ("n 2^40", "/generate", sp(n=2**40), {}, {400}, "n"),
    ("seed -1", "/generate", sp(seed=-1), {}, {400}, "seed"),
    ("seed 2^64", "/generate", sp(seed=2**64), {}, {400}, "seed"),
    ("17 stop strings", "/generate", sp(stop=[f"s{i}" for i in range(17)]), {}, {400}, "stop"),
    ("a stop string of 100k characters", "/generate", sp(stop=["x" * 100_000]), {}, {400}, "stop"),
    (
        "1000 stop ids",
        "/generate",
        sp(stop_token_ids=list(range(1000))),
        {},
        {400},
        "stop_token_ids",
    ),
    ("max_new_tokens -1", "/generate", sp(max_new_tokens=-1), {}, {400}, "max_new_tokens"),
    ("min_new_tokens 2^40", "/generate", sp(min_new_tokens=2**40), {}, {400}, "min_new_tokens"),
    ("unknown sampling parameter", "/generate", sp(bogus=1), {}, {400}, "bogus"),
    (
        "sampling_params a string",
        "/generate",
        {"text": "hi", "sampling_params": "fast"},
        {},
        {400},
        "",
    ),
    ("a regex of 100k characters", "/generate", sp(regex="a" * 100_000), {}, {400}, "regex"),
    (
        "a json_schema of 200 KB",
        "/generate",
        sp(json_schema=json.dumps({"enum": ["v" * 100] * 2000})),
        {},
        {400},
        "json_schema",
    ),
    ("1000 choices", "/generate", sp(choices=[f"c{i}" for i in range(1000)]), {}, {400}, "choices"),
    (
        "regex and json_schema together",
        "/generate",
        sp(regex="a", json_schema=json.dumps(OK_SCHEMA)),
        {},
        {400},
        "",
    ),
    ("an invalid regex", "/generate", sp(regex="(("), {}, {400}, "regex"),
    (
        "a json_schema that is not JSON",
        "/generate",
        sp(json_schema="{not json"),
        {},
        {400},
        "json_schema",
    ),
    (
        "a json_schema nested 40 deep",
        "/generate",
        sp(json_schema=json.dumps(deep)),
        {},
        {400},
        "json_schema",
    ),
    # llguidance (the default auto backend's first) proves these disjoint and serves them; outlines refuses
    (
        "oneOf of 64 disjoint 64-value enums",
        "/generate",
        sp(json_schema=json.dumps(ONE_OF_ENUMS)),
        {},
        {200, 400},
        "json_schema",
    ),
    (
        "an input id past the vocab",
        "/generate",
        {"input_ids": [1, 2, 10**6]},
        {},
        {400},
        "input_ids",
    ),
    ("a negative input id", "/generate", {"input_ids": [1, -2]}, {}, {400}, "input_ids"),
    ("an input id of 2^70", "/generate", {"input_ids": [1, BIG]}, {}, {400}, "input_ids"),
    ("an empty text", "/generate", {"text": ""}, {}, {400}, "prompt"),
    ("empty input_ids", "/generate", {"input_ids": []}, {}, {400}, ""),
    (
        "logprob_start_len 10^9",
        "/generate",
        {"text": "hi", "return_logprob": True, "logprob_start_len": 10**9},
        {},
        {400},
        "logprob_start_len",
    ),
    (
        "top_logprobs_num 21",
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": 21},
        {},
        {400},
        "top_logprobs",
    ),
    (
        "top_logprobs_num 2^70",
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": BIG},
        {},
        {400},
        "top_logprobs",
    ),
    (
        "a batch of 300 prompts",
        "/generate",
        {"text": ["hi"] * 300, "sampling_params": {"max_new_tokens": 1}},
        {},
        {400},
        "max_prompts_per_request",
    ),
    (
        "20 prompts x n=16",
        "/generate",
        {"text": ["hi"] * 20, "sampling_params": {"max_new_tokens": 1, "n": 16}},
        {},
        {400},
        "max_prompts_per_request",
    ),
    (
        "a prompt longer than the pool",
        "/generate",
        {"input_ids": [5] * (POOL_TOKENS + 10)},
        {},
        {400},
        "pool",
    ),
    ("a body that is not JSON", "/generate", b"{text: hi", {}, {400}, "JSON"),
    ("a body that is not UTF-8", "/generate", b'{"text": "\xff\xfe"}', {}, {400}, "UTF-8"),
    (
        "a body past the size limit",
        "/generate",
        b'{"text": "' + b"a" * (9 << 20) + b'"}',
        {},
        {413},
        "",
    ),
    ("both text and input_ids", "/generate", {"text": "a", "input_ids": [1]}, {}, {400}, "text"),
    ("stream as a string", "/generate", {"text": "a", "stream": "yes"}, {}, {400}, "stream"),
    # the browser's ways in
    (
        "JSON posted as text/plain",
        "/generate",
        json.dumps(PLAIN).encode(),
        {"content-type": "text/plain"},
        {415},
        "JSON",
    ),
    (
        "a form post",
        "/generate",
        b"text=hi",
        {"content-type": "application/x-www-form-urlencoded"},
        {415},
        "JSON",
    ),
    ("a foreign Origin", "/generate", PLAIN, {"origin": "https://evil.example"}, {403}, "Origin"),
    (
        "a foreign Host (DNS rebinding)",
        "/generate",
        PLAIN,
        {"host": "evil.example:30000"},
        {400},
        "Host",
    ),
    # the OpenAI routes
    (
        "chat with no messages",
        "/v1/chat/completions",
        {"model": "x", "messages": []},
        {},
        {400},
        "messages",
    ),
    (
        "chat max_tokens -5",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5},
        {},
        {400},
        "",
    ),
    (
        "chat top_logprobs 50",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50},
        {},
        {400},
        "top_logprobs",
    ),
    (
        "json_schema response_format without a schema",
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema"},
        },
        {},
        {400},
        "response_format",
    ),
    (
        "an unknown role",
        "/v1/chat/completions",
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {},
        {400},
        "",
    ),
    ("completions n 100", "/v1/completions", {"prompt": "hi", "n": 100}, {}, {400}, "n"),
    (
        "completions with 300 prompts",
        "/v1/completions",
        {"prompt": ["hi"] * 300, "max_tokens": 1},
        {},
        {400},
        "",
    ),
    # pins
    ("a pin ttl of 10^9 s", "/pin_prefix", {"text": "hi there", "ttl_s": 1e9}, {}, {400}, "ttl_s"),
]


def post(srv, route: str, body, headers: dict) -> httpx.Response:
    hdrs = {"content-type": "application/json", **headers}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.url + route, content=data, headers=hdrs, timeout=120)


def plain_works(srv) -> None:
    r = httpx.post(srv.url + "/generate", json=PLAIN, timeout=120)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8, r.text


def test_hostile_inputs_are_refused_and_the_server_keeps_serving(server):
    assert len(HOSTILE) >= 50
    held = 0
    for label, route, body, headers, statuses, word in HOSTILE:
        r = post(server, route, body, headers)
        assert r.status_code in statuses, (label, r.status_code, r.text[:300])
        if r.status_code != 200:  # (served only where a backend can enforce it within its limits)
            err = r.json()["error"]
            assert word.lower() in json.dumps(err).lower(), (label, err)
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200, label
        plain_works(server)
        # idle: a full integrity walk
        info = httpx.get(server.url + "/get_server_info", timeout=30).json()
        assert info["integrity_ok"] and info["num_running"] == 0, (label, info["integrity_error"])
        held += 1
    # state changes are POST only
    assert httpx.get(server.url + "/flush_cache", timeout=30).status_code == 405
    plain_works(server)
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["kv_pages_free"] == info["kv_pages_total"] and info["integrity_ok"], info
    assert info["num_step_failures"] == 0
    print(f"hostile inputs tried and held: {held}")


def test_pins_are_unguessable_and_a_stranger_cannot_unpin(server):
    r = httpx.post(
        server.url + "/pin_prefix",
        json={"text": "A prefix worth pinning for a while. " * 4, "ttl_s": 60},
        timeout=120,
    ).json()
    handle = r["handle"]
    assert handle and len(handle) >= 20
    # a no-op
    assert httpx.post(server.url + "/unpin", json={"handle": "0-1"}, timeout=30).status_code == 200
    assert httpx.get(server.url + "/get_server_info", timeout=30).json()["num_pins"] == 1
    assert httpx.post(server.url + "/unpin", json={"handle": handle}, timeout=30).status_code == 200
    # the unpin is a one-way message to the scheduler: waited for (the wait ends when it lands; the
    # deadline, roomy for a loaded box, only bounds a failure: an unpin that never lands)
    deadline = time.monotonic() + 30
    while (
        httpx.get(server.url + "/get_server_info", timeout=30).json()["num_pins"]
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert httpx.get(server.url + "/get_server_info", timeout=30).json()["num_pins"] == 0


async def timed(aw) -> tuple[httpx.Response, float]:
    """aw's response and the moment it came."""
    r = await aw
    return r, time.monotonic()


def test_a_compile_storm_neither_blocks_health_nor_slows_a_plain_request(server):
    # the baselines, on the idle server moments before the storm (same machine, same load)
    idle_health_s = []
    for _ in range(10):
        t = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        idle_health_s.append(time.monotonic() - t)
        time.sleep(0.1)
    normal = []
    for _ in range(3):
        started = time.monotonic()
        plain_works(server)
        normal.append(time.monotonic() - started)
    normal_s = sorted(normal)[1]  # the median: one hiccup neither tightens nor loosens the bound

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            hostile = [
                asyncio.create_task(
                    timed(
                        client.post(
                            server.url + "/generate",
                            json=sp(regex=f"(a|b)*a(a|b){{{20 + i % 4}}}x{i}"),
                        )
                    )
                )
                # 12 compiles of 3 s one after the other: ~36 s of storm, which still holds more
                # than the 6 asked to be pending when the plain request goes in (~2 s in)
                for i in range(12)
            ]
            await asyncio.sleep(0.3)
            health_s = []
            for _ in range(15):
                t = time.monotonic()
                assert (await client.get(server.url + "/health")).status_code == 200
                health_s.append(time.monotonic() - t)
                await asyncio.sleep(0.1)
            pending_at_send = sum(not h.done() for h in hostile)
            t = time.monotonic()
            r, plain_at = await timed(client.post(server.url + "/generate", json=PLAIN))
            plain_s = plain_at - t
            storm = await asyncio.gather(*hostile)
            # hostile requests still unanswered when the plain answer came (by the moment each came)
            pending_at_plain = sum(at > plain_at for _, at in storm)
            return [h for h, _ in storm], health_s, plain_s, r, pending_at_send, pending_at_plain

    hostile, health_s, plain_s, r, pending_at_send, pending_at_plain = asyncio.run(run())
    assert r.status_code == 200
    # What a blocked loop (HTTP or scheduler: /health crosses both) costs: every compile here runs to
    # its COMPILE_TIMEOUT_S kill in the pool (outlines' DFA of these regexes explodes), so a loop that
    # ran or waited for one stalls a probe for a whole compile, and a frozen loop for longer. A free
    # loop answers in about the idle probe's time; the bound allows 20x the idle worst with a 2 s
    # floor (CPU contention of the niced worker and a loaded box), never a compile's length.
    health_bound_s = min(COMPILE_TIMEOUT_S, max(2.0, 20 * max(idle_health_s)))
    assert max(health_s) < health_bound_s, (health_s, idle_health_s, health_bound_s)
    # A plain request queued behind the compiles waits for those ahead of it: with the pool's one
    # worker, each runs to its COMPILE_TIMEOUT_S kill, one after the other, so such a request is
    # answered only once (nearly) all of them are. Counted in events, not seconds: the storm was on
    # when it was sent, and most of what was pending then was still pending when it was answered.
    assert pending_at_send >= 6, ("the storm was over before the plain request", pending_at_send)
    assert pending_at_plain * 2 >= pending_at_send, (pending_at_plain, pending_at_send, plain_s)
    # ... and it kept its normal speed: CPU contention of the niced compiles on 2 cores slows it (seen
    # 1.59 s vs 0.25 s alone in a full run, on the real model), measured against the median of three
    # plain requests moments before on the same machine
    assert plain_s < 4 * normal_s + 2.0, (plain_s, normal, pending_at_send, pending_at_plain)
    # outlines' DFA of these regexes explodes (refused or timed out: never a hung worker); under the default auto
    # backend llguidance, which builds its automaton lazily, then serves them: a 400 or a 200 whose text matches
    for i, h in enumerate(hostile):
        assert h.status_code in (200, 400), h.text[:200]
        if h.status_code == 200:
            assert re.fullmatch(f"(a|b)*a(a|b){{{20 + i % 4}}}x{i}", h.json()["text"]) or h.json()[
                "meta_info"
            ].get("incomplete"), h.text[:200]
    print(
        f"compile storm: worst /health {max(health_s) * 1000:.0f} ms; plain request {plain_s:.2f} s "
        f"(alone {normal_s:.2f} s)"
    )
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["integrity_ok"]
