"""The serving layer on a launched server whose scheduler is a model-free fake (it echoes the prompt,
so the exact text is known): stop strings through both processes, aborts on disconnect, the 503
cap, timeouts, validation that never reaches the scheduler, and the watchdog when the scheduler dies.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess, inflight_then, sse_events

PROMPT = "alpha beta STOP gamma delta"


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    srv = ServerProcess(
        [
            "--max-running-requests",
            "3",
            "--max-queued-requests",
            "2",
            "--max-requests-per-client",  # every request here is one client's: the 503, not a 429
            "5",
            "--request-timeout",
            "4",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("fake"),
        fake_scheduler=True,
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


def info(srv) -> dict:
    return httpx.get(srv.url + "/get_server_info", timeout=30).json()


def wait_idle(srv, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        i = info(srv)
        if i["num_running"] == 0 and i["num_inflight_requests"] == 0:
            return i
        time.sleep(0.1)
    raise AssertionError(f"server not idle: {i}")


def test_echo_text_and_stream_equal_nonstream(fake_server):
    body = {"text": "one two three", "sampling_params": {"max_new_tokens": 7}}
    r = httpx.post(fake_server.url + "/generate", json=body, timeout=30).json()
    # echoed
    assert r["text"] == "one two threeone two threeone" and r["meta_info"]["completion_tokens"] == 7
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
    with httpx.stream(
        "POST", fake_server.url + "/generate", json={**body, "stream": True}, timeout=30
    ) as resp:
        events = sse_events(list(resp.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == r["text"] and chunks[-1]["output_ids"] == r["output_ids"]
    # cumulative, SGLang style
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:]))


def test_stop_string_trimmed_across_processes(fake_server):
    sp = {"max_new_tokens": 30, "stop": ["STOP"]}
    r = httpx.post(
        fake_server.url + "/generate", json={"text": PROMPT, "sampling_params": sp}, timeout=30
    ).json()
    assert r["text"] == "alpha beta " and r["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": "STOP",
    }
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 30, "stop": "STOP", "stream": True}
    with httpx.stream("POST", fake_server.url + "/v1/completions", json=body, timeout=30) as resp:
        chunks = [json.loads(e) for e in sse_events(list(resp.iter_lines()))[:-1]]
    deltas = [c["choices"][0]["text"] for c in chunks]
    assert "".join(deltas) == "alpha beta " and not any("S" in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_batch_and_n_indexes(fake_server):
    body = {
        "text": ["a b c", "x y"],
        "sampling_params": [{"max_new_tokens": 3, "n": 2}, {"max_new_tokens": 2}],
    }
    r = httpx.post(fake_server.url + "/generate", json=body, timeout=30).json()
    assert [x["index"] for x in r] == [0, 1, 2]
    assert [x["meta_info"]["completion_tokens"] for x in r] == [3, 3, 2]
    assert r[0]["text"] == r[1]["text"] and r[2]["text"].startswith("x y")
    chat = httpx.post(
        fake_server.url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
            "n": 3,
            "max_tokens": 4,
        },
    ).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    assert chat["usage"]["completion_tokens"] == 12


def test_bad_requests_never_reach_the_scheduler(fake_server):
    before = info(fake_server)["num_added"]
    u = fake_server.url
    bad = [
        ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}),
        ("/generate", {"text": "x", "input_ids": [1]}),
        ("/generate", {"input_ids": [10**9]}),
        ("/generate", {"input_ids": list(range(3, 1100))}),  # longer than the fake's 1024 context
        ("/v1/completions", {"prompt": "", "model": "default"}),
        ("/v1/chat/completions", {"messages": [{"role": "alien", "content": "x"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 99}),
    ]
    for path, body in bad:
        r = httpx.post(u + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500, (path, body, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert info(fake_server)["num_added"] == before


def test_client_disconnect_aborts(fake_server):
    async def drop(stream: bool) -> None:
        body = {
            "text": "long prompt here",
            "sampling_params": {"max_new_tokens": 300},
            "stream": stream,
        }
        async with httpx.AsyncClient(timeout=30) as client:
            task = asyncio.create_task(client.post(fake_server.url + "/generate", json=body))
            await asyncio.sleep(0.8)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    for stream in (False, True):
        before = info(fake_server)["num_tokens_generated"]
        asyncio.run(drop(stream))
        after = wait_idle(fake_server, timeout=30)
        # an abort freed it: far fewer than the 300 tokens it asked for were generated
        assert after["num_tokens_generated"] - before < 300 and after["num_aborted"] >= 1, (
            before,
            after,
        )


def test_overload_is_503_and_timeout_aborts(fake_server):
    async def run() -> list[httpx.Response]:
        body = {"text": "busy busy", "sampling_params": {"max_new_tokens": 480}}
        async with httpx.AsyncClient(timeout=30) as client:
            busy = [
                asyncio.create_task(client.post(fake_server.url + "/generate", json=body))
                for _ in range(5)
            ]
            await asyncio.sleep(1.0)
            extra = await client.post(fake_server.url + "/generate", json=body)
            return [extra, *await asyncio.gather(*busy)]

    extra, *busy = asyncio.run(run())
    assert extra.status_code == 503 and extra.json()["error"]["type"] == "server_overloaded"
    # --request-timeout 4: the five long ones end as aborts before their 480 tokens (>= 4.8 s)
    assert all(r.status_code == 200 for r in busy)
    assert all(r.json()["meta_info"]["finish_reason"]["type"] == "abort" for r in busy)
    assert wait_idle(fake_server)["num_running"] == 0


def test_zz_watchdog_fails_inflight_and_exits_clean(fake_server):
    """Last: kills the fake scheduler (a prompt with CRASH) while requests run."""
    plain, streamed, crash = inflight_then(fake_server.url, "CRASH now")
    assert plain.status_code == 503 and plain.json()["error"]["type"] == "server_error"
    assert "scheduler process died" in plain.json()["error"]["message"]
    assert "error" in json.loads(streamed[-2]) and streamed[-1] == "[DONE]"
    try:
        assert httpx.get(fake_server.url + "/health", timeout=5).status_code != 200
    except httpx.TransportError:
        pass  # already gone
    assert fake_server.proc.wait(30) != 0
    time.sleep(0.5)
    assert fake_server.alive_pids() == []
    assert fake_server.ipc_leftovers() == []
    assert "scheduler process died" in fake_server.log()
