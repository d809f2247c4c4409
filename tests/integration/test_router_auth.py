"""The real gateway (smg, and sglang-router behind --router-backend) as dp_launch starts it for a
server with --api-key, in front of a stub worker on loopback (no model): it refuses clients without
the key, presents the key to the worker, and the key is in no process's command line; what reaches
the worker of a body's isolating fields (a tenant's cache_salt, its session, the adapter, the PD
bootstrap fields): smg passes all of them on every route, sglang-router drops exactly what
router_main.DROPPED_BY_SGLANG_ROUTER says (and serve warns of). Truth: what the stub worker saw, and
/proc."""

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
from radixrt.runtime.serving.launch import dp_launch, router_main

KEY = "router-key-seen-by-no-ps-1"
ISOLATING = {
    "cache_salt": "tenant-7",
    "session_id": "chat-1",
    "lora_path": "adapter-a",
    "bootstrap_host": "10.0.0.1",
    "bootstrap_port": 8998,
    "bootstrap_room": 12345,
}
CHAT_REPLY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "stub",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class StubWorker(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []
    bodies: dict[str, dict] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        StubWorker.seen.append((self.command, self.path, self.headers.get("authorization")))
        if raw:
            StubWorker.bodies[self.path] = json.loads(raw)
        body = {"text": "hi", "meta_info": {"id": "x", "finish_reason": {"type": "length"}}}
        if "chat" in self.path:
            body = CHAT_REPLY
        if "model_info" in self.path or "server_info" in self.path:
            body = {"model_path": "stub", "served_model_name": "stub"}
        if self.path.startswith("/v1/models"):  # smg learns which models a worker serves
            body = {"object": "list", "data": [{"id": "stub", "object": "model"}]}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module", params=sorted(router_main.ROUTER_BACKENDS))
def router(request):
    if not dp_launch.router_available(request.param):
        pytest.skip(f"{request.param} is not installed (the test extra brings both)")
    worker = ThreadingHTTPServer(("127.0.0.1", free_port()), StubWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{worker.server_address[1]}"
    config = ServerConfig(api_key=KEY, port=free_port(), router_backend=request.param)
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
    yield base, proc, request.param
    dp_launch.stop_all([proc])
    worker.shutdown()


def test_router_asks_clients_for_the_key_and_presents_it(router):
    base, _, _ = router
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(base + "/generate", json=body, headers=headers).status_code == 401
        assert httpx.get(base + "/workers", headers=headers).status_code == 401
    StubWorker.seen.clear()
    ok = httpx.post(base + "/generate", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.json()["text"] == "hi"
    assert ("POST", "/generate", f"Bearer {KEY}") in StubWorker.seen


def test_the_key_is_in_no_command_line(router):
    _, proc, _ = router
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in procs:
        assert not [a for a in p.cmdline() if KEY in a], p.cmdline()


ROUTES = {
    "/generate": {"text": "hello", "sampling_params": {"max_new_tokens": 1}},
    "/v1/completions": {"model": "stub", "prompt": "hello", "max_tokens": 1},
    "/v1/chat/completions": {
        "model": "stub",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    },
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_isolating_fields_reach_the_worker(router, route):
    base, _, backend = router
    StubWorker.bodies.clear()
    r = httpx.post(
        base + route,
        json={**ROUTES[route], **ISOLATING},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    got = StubWorker.bodies[route]
    dropped = {k for k in ISOLATING if got.get(k) != ISOLATING[k]}
    if backend == "smg":
        assert dropped == set(), got
    else:  # what serve warns of behind sglang-router, no more and no less
        assert dropped == set(router_main.DROPPED_BY_SGLANG_ROUTER.get(route, ())), got
