"""`radixrt serve --dp-size 2`: two replicas behind the real gateway (smg, cache-aware policy).

Truth: the replicas' own counters (/get_server_info on each, found through the router's /workers): requests
that share a long prefix are admitted by one replica, which then reports them as cache hits; a killed
replica is routed around (every later request answers), nothing hangs. The replicas serve the session's
tiny random Llama (tiny_model_dir; the launcher hands --model-path on to each): routing and the cache
hits it earns are the point, and they depend on the prompts' tokens, not on what the model says.
"""

import os
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess

pytestmark = pytest.mark.integration
pytest.importorskip("smg", reason="--dp-size needs a gateway (pip install smg)")
TENANTS = [
    "You are the support bot of a bicycle shop. You answer questions about repairs, parts and opening "
    "hours politely and briefly. ",
    "You are a museum guide who explains paintings, sculptures and the history of art to visitors in "
    "plain words. ",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        ["--model-path", tiny_model_dir, "--dp-size", "2", "--log-level", "warning"],
        tmp_path_factory.mktemp("dp"),
    )
    yield srv
    srv.stop()


def workers(server) -> list[str]:
    body = httpx.get(server.url + "/workers", timeout=30).json()
    return [w["url"] for w in body["workers"]]


def generate(server, text: str, timeout: float = 120) -> dict:
    r = httpx.post(
        server.url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        timeout=timeout,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_requests_sharing_a_prefix_land_on_the_same_replica(server, tiny_model_dir):
    urls = workers(server)
    assert len(urls) == 2
    for u in urls:  # the launcher handed --model-path on to each replica
        got = httpx.get(u + "/get_model_info", timeout=30).json()
        assert got["served_model_name"] == os.path.basename(tiny_model_dir), got
    before = {u: httpx.get(u + "/get_server_info", timeout=30).json() for u in urls}
    outs = []
    for i in range(6):
        for tenant in TENANTS:
            outs.append(generate(server, tenant + f"Visitor {i} asks: question number {i}?"))
    after = {u: httpx.get(u + "/get_server_info", timeout=30).json() for u in urls}
    admitted = {
        u: after[u]["num_requests_admitted"] - before[u]["num_requests_admitted"] for u in urls
    }
    assert sum(admitted.values()) == 12
    # cache-aware routing: after each tenant's first request, its prefix is a hit on the replica that holds it
    cached = [o["meta_info"]["cached_tokens"] for o in outs[2:]]
    assert min(cached) >= 20, cached
    assert sum(after[u]["cached_tokens"] - before[u]["cached_tokens"] for u in urls) >= 10 * 20


SALTED_PROMPT = (
    "You are the archivist of a small town library. You keep records of every book, map and "
    "letter that the town has collected over two hundred years, and you answer briefly. "
)


@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions"])
def test_a_tenants_salt_reaches_the_replica_through_the_gateway(server, route):
    """The gateway routes by the text (both land on one replica), but the replica keeps the
    salted request's KV apart: its first try finds nothing of the unsalted request's prefix cached
    (behind sglang-router 0.3.2 it found 645 of 646 tokens), its second finds its own."""
    text = SALTED_PROMPT + f"Which route is this? {route}"

    def cached(salt: str | None) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        if route == "/generate":
            body = {"text": text, "sampling_params": {"max_new_tokens": 1}, **extra}
        else:
            body = {
                "model": "default",  # the gateway routes by it (an alias of the served name)
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 1,
                **extra,
            }
        r = httpx.post(server.url + route, json=body, timeout=120)
        assert r.status_code == 200, r.text
        if route == "/generate":
            return r.json()["meta_info"]["cached_tokens"]
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached(None)
    assert cached(None) >= 40  # the unsalted prefix is cached where the gateway sends this text
    assert cached("tenant-a") == 0
    assert cached("tenant-a") >= 40


def test_a_killed_replica_is_routed_around(server):
    urls = workers(server)
    victim = httpx.get(urls[0] + "/get_server_info", timeout=30).json()
    assert victim["integrity_ok"]
    pid = next(p for p in server.alive_pids() if _serves(p, urls[0]))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    answered = 0
    while time.monotonic() < deadline and answered < 6:
        try:
            r = httpx.post(
                server.url + "/generate",
                json={
                    "text": TENANTS[answered % 2] + "Still there?",
                    "sampling_params": {"max_new_tokens": 2},
                },
                timeout=60,
            )
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            answered += 1
    assert answered == 6, "requests after a replica died did not get answers"
    assert server.proc.poll() is None  # one replica left: the server keeps serving


def _serves(pid: int, url: str) -> bool:
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    port = url.rsplit(":", 1)[1]
    return "serve" in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1] == port
