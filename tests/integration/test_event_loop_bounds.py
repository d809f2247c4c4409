"""#41: no request stalls the HTTP event loop. Each body below once froze `radixrt serve` (an
automaton built on the loop before its size was checked, a detokenize or a chat-template render of
client size run there): while they are answered, all at once, /health is polled every 0.2 s and
every answer must come within a bound taken from the same probes on the idle server moments before
(20 times their worst, at least 2 s, at most 5 s: the explosive automata, built on the loop, freeze
it for good); each body gets its 4xx naming the field (or a normal answer where the body is merely
big but allowed), and afterwards the server still generates, stop_regex included. The server runs
the session's tiny random Llama with the default tokenizer (tests/conftest.py): what freezes the loop
is the bodies' automata, detokenizes and renders, not the weights.
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess

HEALTH_EVERY_S = 0.2
# /health during the storm: within HEALTH_IDLE_FACTOR times the worst idle probe, at least
# HEALTH_FLOOR_S (a loaded 2-core box; the loop still parses the big bodies and the scheduler answers
# between its steps), at most HEALTH_CAP_S, half a probe's own 10 s timeout. What the bug costs is
# far more: an automaton of NESTED or EXPLOSIVE built on the loop does not finish within a probe's
# timeout (a failed probe counts as infinitely slow), whatever the load.
HEALTH_IDLE_FACTOR = 20
HEALTH_FLOOR_S = 2.0
HEALTH_CAP_S = 5.0
NESTED = "(((a{9999}){9999}){9999})"  # shortest match 9999**3 characters
EXPLOSIVE = "[ab]*a[ab]{26}"  # its automaton has 2**27 states


def gen(**sampling) -> dict:
    return {"text": "Hello", "sampling_params": {"max_new_tokens": 4, **sampling}}


# (label, route, body, allowed statuses, word a 4xx must contain)
HOSTILE = [
    ("stop_regex of nested repeats", "/generate", gen(stop_regex=NESTED), (400,), "stop_regex"),
    ("stop_regex of 2^27 states", "/generate", gen(stop_regex=EXPLOSIVE), (400,), "stop_regex"),
    (
        "stop_regex list, the last explosive",
        "/generate",
        gen(stop_regex=["\n\n", "[ab]*b[ab]{25}x"]),
        (400,),
        "stop_regex",
    ),
    # a valid constraint: refused, or served (llguidance builds its automaton lazily)
    (
        "regex of 2^27 states",
        "/generate",
        gen(regex=EXPLOSIVE, min_new_tokens=4),
        (200, 400),
        "regex",
    ),
    (
        "regex of nested repeats",
        "/generate",
        gen(regex=NESTED, min_new_tokens=4),
        (400,),
        "regex",
    ),
    ("detokenize of a million ids", "/detokenize", {"tokens": [42] * 1_000_000}, (400,), "tokens"),
    (
        "chat of 30,000 messages",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"hi {i}"}
                for i in range(30_000)
            ],
            "max_tokens": 1,
        },
        (400,),
        "prompt",
    ),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            "--model-path",
            tiny_model_dir,
            "--max-total-tokens",
            "4096",
            "--grammar-compile-timeout",
            "3",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("event_loop"),
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


async def poll_health(client: httpx.AsyncClient, url: str, done: asyncio.Event) -> list[float]:
    """Seconds each /health took (a failed or timed-out probe counts as infinitely slow)."""
    took = []
    while not done.is_set():
        started = time.monotonic()
        try:
            ok = (await client.get(url + "/health", timeout=10)).status_code == 200
        except httpx.HTTPError:
            ok = False
        took.append(time.monotonic() - started if ok else float("inf"))
        await asyncio.sleep(HEALTH_EVERY_S)
    return took


async def idle_health(url: str, seconds: float = 2.0) -> list[float]:
    """The same probes, on the idle server: the baseline of the bound."""
    async with httpx.AsyncClient(timeout=60) as client:
        done = asyncio.Event()
        poller = asyncio.create_task(poll_health(client, url, done))
        await asyncio.sleep(seconds)
        done.set()
        return await poller


async def hostile_with_health(url: str) -> tuple[list, list[float]]:
    async with httpx.AsyncClient(timeout=60) as client:
        done = asyncio.Event()
        poller = asyncio.create_task(poll_health(client, url, done))
        await asyncio.sleep(0.5)  # a few fast probes first: the poller itself works
        try:
            # exceptions kept: on a frozen loop /health's verdict comes first
            answers = await asyncio.gather(
                *(client.post(url + route, json=body) for _, route, body, _, _ in HOSTILE),
                return_exceptions=True,
            )
        finally:
            await asyncio.sleep(0.5)
            done.set()
        return answers, await poller


def test_hostile_bodies_leave_the_event_loop_free(server):
    # one-time costs of the first constrained requests, whatever their size, paid before the clock
    # starts: the scheduler builds its grammar backends then (a ~1 s walk of the vocabulary), and
    # the first one llguidance serves imports llguidance.torch (torch.compile: seconds of imports)
    for warm in (gen(regex="(yes|no)", stop_regex="s"), gen(ebnf='root ::= "yes" | "no"')):
        assert httpx.post(server.url + "/generate", json=warm, timeout=120).status_code == 200
    idle_s = asyncio.run(idle_health(server.url))
    assert len(idle_s) >= 5 and max(idle_s) < float("inf"), idle_s
    within_s = min(HEALTH_CAP_S, max(HEALTH_FLOOR_S, HEALTH_IDLE_FACTOR * max(idle_s)))
    started = time.monotonic()
    answers, health_s = asyncio.run(hostile_with_health(server.url))
    elapsed = time.monotonic() - started
    print(
        f"worst /health {max(health_s):.2f} s over {len(health_s)} probes, {elapsed:.1f} s "
        f"(idle worst {max(idle_s):.3f} s: bound {within_s:.2f} s)"
    )
    assert len(health_s) >= 5, health_s
    assert max(health_s) < within_s, (health_s, idle_s, within_s, server.log())
    for (label, _, _, statuses, word), res in zip(HOSTILE, answers):
        assert isinstance(res, httpx.Response), (label, res)
        assert res.status_code in statuses, (label, res.status_code, res.text[:300])
        if res.status_code >= 400:
            assert word in res.json()["error"]["message"], (label, res.text[:300])
    # and the server still generates, a stop_regex request among them
    plain = httpx.post(server.url + "/generate", json=gen(temperature=0), timeout=60)
    assert plain.status_code == 200 and plain.json()["meta_info"]["completion_tokens"] > 0
    stopped = httpx.post(
        server.url + "/generate", json=gen(temperature=0, stop_regex=r"[a-z]"), timeout=60
    )
    assert stopped.status_code == 200, stopped.text[:300]
    assert httpx.get(server.url + "/get_server_info", timeout=30).json()["integrity_ok"]
