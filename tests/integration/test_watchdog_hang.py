"""A scheduler that hangs without dying (the fake scheduler's HANG prompt): the heartbeat watchdog
fails every in-flight request within its bound, /health stops answering 200, and the server exits
non-zero with no process or socket left behind. The fake scheduler loads no weights, only a
tokenizer: the server is pointed at the session's tiny random Llama (tests/conftest.py), which
carries the default tokenizer."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
from conftest_server import ServerProcess, inflight_then

WATCHDOG_S = 3
# How late the watchdog may notice: it reads the heartbeat's age every 0.25 s on the HTTP process's
# event loop (launch.py), and fires at the first look past WATCHDOG_S, reporting the age it saw
# (rounded to whole seconds). So the silence it reports is WATCHDOG_S plus the look's lateness: a
# fraction of a second on an idle box, more when a loaded 2-core box leaves that process waiting for a
# core. 15 s of lateness still keeps the answer far inside the clients' 60 s timeout (what no
# watchdog at all comes to: the requests hang until then) and below the default --watchdog-timeout
# (120 s), which a server that ignored the flag would wait for.
WATCHDOG_LATE_S = 15
CLIENT_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        [
            "--model-path",
            tiny_model_dir,
            "--watchdog-timeout",
            str(WATCHDOG_S),
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("hang"),
        fake_scheduler=True,
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


def test_hung_scheduler_fails_inflight_requests_within_the_watchdog_bound(server):
    # healthy first, and the heartbeat does not misfire on an idle server
    time.sleep(WATCHDOG_S + 1)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200

    plain, streamed, hang = inflight_then(
        server.url, "HANG here", max_new_tokens=500, timeout=CLIENT_TIMEOUT_S
    )
    for res in (plain, hang):
        # an exception here (the client's timeout) is the bug: no watchdog failed them
        assert isinstance(res, httpx.Response), res
        message = res.json()["error"]["message"]
        assert res.status_code == 503 and "made no progress" in message, res.text
        silent_s = int(message.split("made no progress for ")[1].split(" s")[0])
        # never before its bound (no misfire); noticed late at most by WATCHDOG_LATE_S
        assert WATCHDOG_S <= silent_s <= WATCHDOG_S + WATCHDOG_LATE_S, message
    assert isinstance(streamed, list), streamed
    assert "error" in json.loads(streamed[-2]) and streamed[-1] == "[DONE]"
    try:
        assert httpx.get(server.url + "/health", timeout=5).status_code != 200
    except httpx.TransportError:
        pass  # already gone
    assert server.proc.wait(30) != 0
    time.sleep(0.5)
    assert server.alive_pids() == []
    assert server.ipc_leftovers() == []
