"""Prefill-decode disaggregation for real: a prefill server, a decode server and the gateway's (smg) PD
mode in front (`--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL --api-key SECRET`), the KV
moved over the pair's CURVE-authenticated ZeroMQ channel; a unified server beside them is the truth.

Truth: the unified server's greedy output in float32 (token for token); the servers' own counters
(/get_server_info: prompt tokens computed, pages and bytes moved, integrity); after every test both
servers settle with every page free or in their trees. Every server serves the session's tiny random
Llama (tiny_model_dir, the default model's tokenizer): the plumbing is the point, and equal outputs of
the disaggregated pair and a unified server hold for any model.
"""

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest_server import ServerProcess, free_port, sse_events

pytestmark = pytest.mark.integration
pytest.importorskip("smg", reason="the PD gateway is smg's (pip install smg)")

PAGE = 4
COMMON = ["--page-size", str(PAGE), "--max-total-tokens", "8192", "--log-level", "warning"]
# the module's prefill server (the kill test's victim) computes prompts in chunks of this many tokens
# (the default is 512): small, so that a long prompt takes dozens of the tiny model's short steps
# (see the kill test); what any other test has computed there fits in one chunk
PREFILL_CHUNK = 64
TIMEOUT_S = 10
SECRET = "the-pair-secret-of-this-test"
# the servers take their secrets from there, not argv; the channel's is theirs alone
PD_ENV = {
    "RADIXRT_DISAGGREGATION_SECRET": SECRET,
    "RADIXRT_DISAGGREGATION_CHANNEL_SECRET": "the-channel-secret-of-this-test",
}
# the router asks its clients for its --api-key and presents it to the servers (the pair's secret)
AUTH = {"Authorization": f"Bearer {SECRET}"}
post = functools.partial(httpx.post, headers=AUTH)
SYSTEM = (
    "You are the assistant of a small bakery. You answer questions about bread, cakes, opening hours "
    "and orders in one or two friendly sentences, and you never invent prices. "
)
QUESTIONS = [
    "Do you sell rye bread?",
    "When do you open on Sunday?",
    "Can I order a birthday cake?",
    "Is the croissant made with butter?",
    "Do you have gluten-free options?",
    "How long does sourdough keep?",
    "Can you deliver to the office?",
    "What is your most popular cake?",
]
OTHERS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 1, 2, 3, 5, 8,",
    "Once upon a time in a quiet village,",
    "The three primary colours are",
    "SELECT name FROM users WHERE",
    "Water boils at",
    "The opposite of hot is",
]


def start_router(prefill: ServerProcess, decode: ServerProcess, bootstrap_port: int, name: str):
    """The gateway's PD mode as one starts it by hand (docs/disaggregation.md): it routes by the
    body's model among the names the servers list, so "default" is given as an alias of theirs."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smg.launch_router",
            "--disable-tokenizer-autoload",
            "--model-alias",
            f"default={name}",
            "--pd-disaggregation",
            "--prefill",
            prefill.url,
            str(bootstrap_port),
            "--decode",
            decode.url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(free_port()),
            "--api-key",
            SECRET,
            "--log-level",
            "warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if post(url + "/generate", json=body("Hi", 1), timeout=60).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError("the PD router did not come up")


def body(text, max_new=20, **extra):
    return {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}, **extra}


CHAT = {
    "model": "default",
    "messages": [{"role": "user", "content": "Name two fruits."}],
    "max_tokens": 16,
    "temperature": 0,
}
COMPLETION = {"model": "default", "prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0}
TEXTS = [SYSTEM + q for q in QUESTIONS] + OTHERS


def unified_answers(tmp_dir, common: list[str]) -> dict:
    """The truth, from a unified server stopped again before the disaggregated ones start (so no
    more than two or three servers are up at once)."""
    unified = ServerProcess(common, tmp_dir)
    try:
        url = unified.url
        gen = post_all([(url + "/generate", body(t)) for t in TEXTS])
        return {
            "texts": [r.json()["output_ids"] for r in gen],
            "chat": post(url + "/v1/chat/completions", json=CHAT, timeout=120).json(),
            "completion": post(url + "/v1/completions", json=COMPLETION, timeout=120).json(),
            "water": post(url + "/generate", json=body("Water boils at", 12), timeout=120).json(),
        }
    finally:
        unified.stop()


@pytest.fixture(scope="module")
def pd(tmp_path_factory, tiny_model_dir):
    common = ["--model-path", tiny_model_dir, *COMMON]
    truth = unified_answers(tmp_path_factory.mktemp("unified"), common)
    bootstrap_port = free_port()
    pd_flags = ["--disaggregation-transfer-timeout", str(TIMEOUT_S)]
    servers = {}
    try:
        servers["prefill"] = ServerProcess(
            [
                *common,
                *pd_flags,
                "--chunked-prefill-size",
                str(PREFILL_CHUNK),
                "--disaggregation-mode",
                "prefill",
                "--disaggregation-bootstrap-port",
                str(bootstrap_port),
            ],
            tmp_path_factory.mktemp("prefill"),
            env=PD_ENV,
        )
        prefill_addr = f"127.0.0.1:{bootstrap_port}"
        servers["decode"] = ServerProcess(
            [
                *common,
                *pd_flags,
                "--disaggregation-mode",
                "decode",
                "--disaggregation-prefill-addrs",
                prefill_addr,
            ],
            tmp_path_factory.mktemp("decode"),
            env=PD_ENV,
        )
        name = os.path.basename(tiny_model_dir)  # the served model name
        router, url = start_router(servers["prefill"], servers["decode"], bootstrap_port, name)
    except Exception:
        for s in servers.values():
            s.stop()
        raise
    yield {
        **servers,
        "router": url,
        "bootstrap_port": bootstrap_port,
        "truth": truth,
        "common": common,
    }
    router.terminate()
    try:
        router.wait(30)
    except subprocess.TimeoutExpired:
        router.kill()
    for s in servers.values():
        s.stop()


def info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=30).json()


def settled(server, timeout=30) -> dict:
    """The server's figures once nothing runs, waits or is held for a transfer."""
    deadline = time.monotonic() + timeout
    while True:
        got = info(server)
        idle = not (got["num_running"] or got["num_waiting"] or got["num_transferring"])
        if idle or time.monotonic() > deadline:
            assert idle, f"{server.url} did not settle: {got}"
            return info(server)  # walked now that it is idle
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def pages_come_back(pd):
    yield
    for name in ("prefill", "decode"):
        if pd[name].proc.poll() is not None:  # the kill test's victim
            continue
        got = settled(pd[name])
        assert got["integrity_ok"], (name, got["integrity_error"])
        assert got["kv_pages_free"] + got["kv_pages_cached"] == got["kv_pages_total"], (name, got)


def streamed(url: str, b: dict) -> list[str]:
    """The SSE payloads of a streamed POST."""
    with httpx.stream("POST", url, json={**b, "stream": True}, headers=AUTH, timeout=120) as r:
        return sse_events(list(r.iter_lines()))


def post_all(url_path_bodies, timeout=180):
    """POST every (url, body) at once; the responses (or the httpx error) in order."""
    out = [None] * len(url_path_bodies)

    def go(i, url, b):
        try:
            out[i] = post(url, json=b, timeout=timeout)
        except httpx.HTTPError as e:  # a server killed under its request
            out[i] = e

    threads = [
        threading.Thread(target=go, args=(i, u, b)) for i, (u, b) in enumerate(url_path_bodies)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_outputs_through_the_router_equal_a_unified_server(pd, tokenizer):
    texts = TEXTS
    before = {k: info(pd[k]) for k in ("prefill", "decode")}
    via_router = post_all([(pd["router"] + "/generate", body(t)) for t in texts])
    for t, a, want in zip(texts, via_router, pd["truth"]["texts"]):
        assert a.status_code == 200, a.text
        assert a.json()["output_ids"] == want, t
    after = {k: settled(pd[k]) for k in ("prefill", "decode")}
    moved = {
        k: {
            f: after[k][f] - before[k][f]
            for f in after[k]
            if f.startswith(("kv_transfer", "prompt_tokens", "cached"))
        }
        for k in after
    }
    dec, pre = moved["decode"], moved["prefill"]
    assert dec["prompt_tokens_computed"] == 0  # the decode server never computed a prompt token
    assert dec["kv_transfers"] == pre["kv_transfers"] == len(texts)
    page_bytes = after["decode"]["kv_bytes_per_token"] * PAGE
    assert dec["kv_transfer_bytes"] == dec["kv_transfer_pages"] * page_bytes > 0
    assert (pre["kv_transfer_pages"], pre["kv_transfer_bytes"]) == (
        dec["kv_transfer_pages"],
        dec["kv_transfer_bytes"],
    )
    # the shared system prompt was computed once on the prefill server, then matched
    system_tokens = len(tokenizer(SYSTEM, add_special_tokens=False)["input_ids"])
    assert pre["cached_tokens"] >= (len(QUESTIONS) - 1) * (system_tokens - 2 * PAGE)
    prompt_tokens = sum(r.json()["meta_info"]["prompt_tokens"] for r in via_router)
    assert pre["prompt_tokens_computed"] <= prompt_tokens - pre["cached_tokens"]


def test_openai_routes_and_streams_work_unchanged_through_the_router(pd):
    truth = pd["truth"]
    a = post(pd["router"] + "/v1/chat/completions", json=CHAT, timeout=120).json()
    assert a["choices"][0]["message"] == truth["chat"]["choices"][0]["message"]
    events = streamed(pd["router"] + "/v1/chat/completions", CHAT)
    text = "".join(
        (json.loads(e)["choices"][0]["delta"].get("content") or "") for e in events if e != "[DONE]"
    )
    assert text == truth["chat"]["choices"][0]["message"]["content"] and events[-1] == "[DONE]"
    events = streamed(pd["router"] + "/generate", body("Water boils at", 12))
    assert json.loads(events[-2])["output_ids"] == truth["water"]["output_ids"]
    a = post(pd["router"] + "/v1/completions", json=COMPLETION, timeout=120).json()
    assert a["choices"][0]["text"] == truth["completion"]["choices"][0]["text"]


def test_a_follow_up_turn_finds_its_history_on_both_servers(pd):
    first = SYSTEM + "Tell me about your apple pie."
    one = post(pd["router"] + "/generate", json=body(first, 16), timeout=120).json()
    before = {k: settled(pd[k]) for k in ("prefill", "decode")}
    follow = first + one["text"] + " And how much sugar is in it?"
    two = post(pd["router"] + "/generate", json=body(follow, 8), timeout=120).json()
    after = {k: settled(pd[k]) for k in ("prefill", "decode")}
    prompt_len = two["meta_info"]["prompt_tokens"]
    decode_cached = two["meta_info"]["cached_tokens"]  # the decode server's own tree
    assert decode_cached >= one["meta_info"]["prompt_tokens"] - PAGE
    pages = after["decode"]["kv_transfer_pages"] - before["decode"]["kv_transfer_pages"]
    assert pages == -(-prompt_len // PAGE) - decode_cached // PAGE  # only the new pages travelled
    prefill_cached = after["prefill"]["cached_tokens"] - before["prefill"]["cached_tokens"]
    assert prefill_cached >= one["meta_info"]["prompt_tokens"] - PAGE


def test_aborts_free_pages_on_both_servers(pd):
    # a stream the client leaves after two events: the decode server aborts it. 2,000 tokens (400 for
    # the real model) keep it running for seconds of the tiny model's steps after the client leaves,
    # so that it is aborted rather than finished, as the decode server's count shows
    aborted = info(pd["decode"])["num_requests_aborted"]
    with httpx.stream(
        "POST",
        pd["router"] + "/generate",
        json=body("Count to a thousand:", 2000, stream=True),
        headers=AUTH,
        timeout=120,
    ) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 3:
                break
    got = settled(pd["decode"])
    assert got["num_requests_aborted"] == aborted + 1, got
    # a request waiting for KV the prefill server never gets, abandoned by its client
    orphan = {
        **body("An orphan", 4),
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": pd["bootstrap_port"],
        "bootstrap_room": 424242,
    }
    with pytest.raises(httpx.TimeoutException):
        post(pd["decode"].url + "/generate", json=orphan, timeout=1.5)
    settled(pd["decode"])
    # its late half on the prefill server is answered at once: the decode side cancelled the room
    r = post(pd["prefill"].url + "/generate", json=orphan, timeout=60)
    assert r.status_code == 500 and "cancelled by the decode server" in r.text


def test_bootstrap_fields_need_the_pair_secret_and_a_configured_prefill_server(pd):
    """A plain client cannot name a room (another request's KV) nor a prefill server of its own."""
    room = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pd["bootstrap_port"]}
    for server in ("prefill", "decode"):
        for headers in ({}, {"Authorization": "Bearer not-the-secret"}):
            for path, b in (
                ("/generate", {**body("Hi", 2), **room, "bootstrap_room": 5}),
                ("/v1/completions", {**COMPLETION, **room, "bootstrap_room": 5}),
                ("/v1/chat/completions", {**CHAT, **room, "bootstrap_room": 5}),
            ):
                r = httpx.post(pd[server].url + path, json=b, headers=headers, timeout=30)
                assert r.status_code == 403, (server, path, r.text)
                assert r.json()["error"]["param"] == "bootstrap_room"
    for host, port in (("10.9.9.9", pd["bootstrap_port"]), ("127.0.0.1", 1), ("!", None)):
        b = {**body("Hi", 2), "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 6}
        r = post(pd["decode"].url + "/generate", json=b, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "bootstrap_host", r.text
    assert httpx.post(pd["router"] + "/generate", json=body("Hi", 2), timeout=30).status_code == 401
    assert post(pd["router"] + "/generate", json=body("Hi", 2), timeout=120).status_code == 200


def test_transfer_timeouts_fail_the_request_alone(pd):
    started = time.monotonic()
    lonely = {"bootstrap_host": "127.0.0.1", "bootstrap_port": pd["bootstrap_port"]}
    prefill_only, decode_only = post_all(
        [
            (
                pd["prefill"].url + "/generate",
                {**body("Nobody asks", 4), **lonely, "bootstrap_room": 1001},
            ),
            (
                pd["decode"].url + "/generate",
                {**body("Nobody sends", 4), **lonely, "bootstrap_room": 1002},
            ),
        ]
    )
    # both end at their TIMEOUT_S transfer timeouts, counted from when each server took its half (so
    # not sooner); the bound above it is a hang's (the client's own 180 s timeout), with room for a
    # loaded box: six times the timeout
    assert TIMEOUT_S <= time.monotonic() - started < 6 * TIMEOUT_S
    assert prefill_only.status_code == 500 and f"within {TIMEOUT_S} s" in prefill_only.text
    assert decode_only.status_code == 500
    assert (
        f"within {TIMEOUT_S} s" in decode_only.text
        or "no request for this room" in decode_only.text
    )
    # and both keep serving
    assert (
        post(pd["router"] + "/generate", json=body("Still there?", 4), timeout=120).status_code
        == 200
    )


def test_a_killed_prefill_server_fails_its_requests_and_the_decode_server_goes_on(
    pd, tmp_path_factory
):
    """Last in the module: its victim is the module's prefill server."""
    victim, decode = pd["prefill"], pd["decode"]
    long_text = " ".join(f"item {i} is number {i * 7 % 13};" for i in range(220))  # ~2k tokens
    reqs = []
    for k in range(4):
        b = {
            **body(f"{k}: " + long_text, 8),
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": pd["bootstrap_port"],
            "bootstrap_room": 9000 + k,
        }
        reqs += [(victim.url + "/generate", b), (decode.url + "/generate", b)]
    results = {}
    t = threading.Thread(target=lambda: results.update(out=post_all(reqs, timeout=120)))
    t.start()
    # The kill comes once the work is seen in flight on both sides, not after a guessed sleep: the
    # decode server holds a room waiting for the victim's KV, and the victim computes one prompt while
    # another still waits its turn. Prompts go one at a time in PREFILL_CHUNK-token chunks (2143
    # tokens: 34 steps each, ~0.3 s of the tiny model's on an idle 2-core box; at the default 512,
    # five steps and ~0.1 s, where the default model took seconds), so a prompt still waiting then
    # cannot be computed and sent in the moment between the victim's answer and the kill: its
    # request must fail.
    deadline = time.monotonic() + 120
    while True:
        on_decode, on_victim = info(decode), info(victim)
        if on_decode["num_transferring"] and on_victim["num_running"] and on_victim["num_waiting"]:
            break
        assert t.is_alive() and time.monotonic() < deadline, (
            "never saw a prompt computed while another waited",
            on_victim,
            on_decode,
        )
        time.sleep(0.02)
    for pid in victim.alive_pids():
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    t.join(120)
    assert not t.is_alive()
    # No hang: the decode server pings a prefill server it waits on every second and fails its rooms
    # after 5 s of silence (a room still waiting for pages then registers and waits 5 s more; the 10 s
    # transfer timeout is the backstop): about 10 s on an idle box. 60 s leaves room for a loaded one
    # and is still half the 120 s client timeout that a request waiting for the dead server forever
    # would run into.
    assert time.monotonic() - killed < 60
    failed = [r for r in results["out"][1::2] if r.status_code != 200]
    assert failed, "every request finished before the kill: the test did not test anything"
    # at least the requests whose prompts had not started on the victim
    assert len(failed) >= on_victim["num_waiting"], (len(failed), on_victim)
    for r in failed:
        assert r.status_code == 500 and "did not arrive" in r.text, r.text
    got = settled(decode)
    assert (
        got["integrity_ok"]
        and got["kv_pages_free"] + got["kv_pages_cached"] == got["kv_pages_total"]
    )
    # the decode server goes on with a fresh prefill server at the configured address
    port = pd["bootstrap_port"]
    fresh = ServerProcess(
        [*pd["common"], "--disaggregation-mode", "prefill"]
        + ["--disaggregation-bootstrap-port", str(port)],
        tmp_path_factory.mktemp("fresh"),  # short: the ipc socket paths live under it
        env=PD_ENV,
    )
    try:
        b = {
            **body(TEXTS[0]),
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": port,
            "bootstrap_room": 77,
        }
        _, out = post_all([(fresh.url + "/generate", b), (decode.url + "/generate", b)])
        assert out.status_code == 200 and out.json()["output_ids"] == pd["truth"]["texts"][0]
    finally:
        fresh.stop()
