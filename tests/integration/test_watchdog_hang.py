"""A scheduler that hangs without dying (the fake scheduler's HANG prompt): the heartbeat watchdog
fails every in-flight request within its bound, /health stops answering 200, and the server exits
non-zero with no process or socket left behind."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess, inflight_then

WATCHDOG_S = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(
        ["--watchdog-timeout", str(WATCHDOG_S), "--log-level", "warning"],
        tmp_path_factory.mktemp("hang"),
        fake_scheduler=True,
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


def test_hung_scheduler_fails_inflight_requests_within_the_watchdog_bound(server):
    # healthy first, and the heartbeat does not misfire on an idle server
    time.sleep(WATCHDOG_S + 1)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200

    plain, streamed, hang = inflight_then(server.url, "HANG here", max_new_tokens=500, timeout=60)
    for res in (plain, hang):
        message = res.json()["error"]["message"]
        assert res.status_code == 503 and "made no progress" in message, res.text
        silent_s = int(message.split("made no progress for ")[1].split(" s")[0])
        assert WATCHDOG_S <= silent_s <= WATCHDOG_S + 2, message  # the watchdog's own bound
    assert "error" in json.loads(streamed[-2]) and streamed[-1] == "[DONE]"
    try:
        assert httpx.get(server.url + "/health", timeout=5).status_code != 200
    except httpx.TransportError:
        pass  # already gone
    assert server.proc.wait(30) != 0
    time.sleep(0.5)
    assert server.alive_pids() == []
    assert server.ipc_leftovers() == []
