"""The real sglang-router as dp_launch starts it for a server with --api-key, in front of a stub
worker on loopback (no model): it refuses clients without the key, presents the key to the worker,
and the key is in no process's command line. Truth: what the stub worker saw, and /proc."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psutil
import pytest

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.processes import free_port
from radixrt.runtime.serving import dp_launch

KEY = "router-key-seen-by-no-ps-1"
pytestmark = pytest.mark.skipif(not dp_launch.router_available(), reason="needs sglang-router")


class StubWorker(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        StubWorker.seen.append((self.command, self.path, self.headers.get("authorization")))
        body = {"text": "hi", "meta_info": {"id": "x", "finish_reason": {"type": "length"}}}
        if "model_info" in self.path or "server_info" in self.path:
            body = {"model_path": "stub", "served_model_name": "stub"}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def router():
    worker = ThreadingHTTPServer(("127.0.0.1", free_port()), StubWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{worker.server_address[1]}"
    config = ServerConfig(api_key=KEY, port=free_port())
    proc = dp_launch.start_router(config, ["--worker-urls", url, "--policy", "round_robin"])
    base = f"http://127.0.0.1:{config.port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the worker is registered
        try:
            r = httpx.get(base + "/workers", headers={"Authorization": f"Bearer {KEY}"})
            if r.status_code == 200 and r.json().get("workers"):
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "the router exited"
        time.sleep(0.3)
    else:
        pytest.fail("the router did not register the stub worker")
    yield base, proc
    dp_launch.stop_all([proc])
    worker.shutdown()


def test_router_asks_clients_for_the_key_and_presents_it(router):
    base, _ = router
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(base + "/generate", json=body, headers=headers).status_code == 401
        assert httpx.get(base + "/workers", headers=headers).status_code == 401
    StubWorker.seen.clear()
    ok = httpx.post(base + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["text"] == "hi"
    assert ("POST", "/generate", f"Bearer {KEY}") in StubWorker.seen


def test_the_key_is_in_no_command_line(router):
    _, proc = router
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in procs:
        assert not [a for a in p.cmdline() if KEY in a], p.cmdline()
