"""Pinned prefixes over HTTP: /pin_prefix holds a prefix in the radix cache until /unpin.

Truth: the scheduler's own page accounting in /get_server_info (num_pins, flush refused
while pinned, every page back after unpin + flush) and a later request's cached_tokens.
"""

import httpx
import pytest
from conftest_server import DEFAULT_SERVER_ARGS

from radixrt.frontend.endpoint import RuntimeEndpoint

PREFIX = "You are a meticulous assistant. Think step by step about the question below. " * 3


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get(DEFAULT_SERVER_ARGS)


def info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", timeout=60).json()


def test_pin_holds_prefix_until_unpin(server):
    res = httpx.post(server.url + "/pin_prefix", json={"text": PREFIX, "ttl_s": 120}, timeout=120)
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["handle"] and body["prompt_tokens"] > 20
    assert info(server)["num_pins"] == 1
    # pinned pages are locked
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 400
    out = httpx.post(
        server.url + "/generate",
        json={
            "text": PREFIX + "What is 2 + 2?",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        },
        timeout=120,
    ).json()
    assert out["meta_info"]["cached_tokens"] >= body["prompt_tokens"] - 1
    assert httpx.post(
        server.url + "/unpin", json={"handle": body["handle"]}, timeout=60
    ).json() == {"success": True}
    assert info(server)["num_pins"] == 0
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    after = info(server)
    assert after["kv_pages_free"] == after["kv_pages_total"] and after["integrity_ok"]


def test_bad_pin_requests_are_4xx(server):
    for body in (
        {},
        {"text": "a", "input_ids": [1]},
        {"text": "a", "ttl_s": -1},
        {"text": 5},
        {"handle": 1},
    ):
        assert (
            400 <= httpx.post(server.url + "/pin_prefix", json=body, timeout=60).status_code < 500
        ), body
    assert httpx.post(server.url + "/unpin", json={"nope": 1}, timeout=60).status_code == 400
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def test_runtime_endpoint_pins_over_http(server):
    backend = RuntimeEndpoint(server.url)
    handle = backend.pin_prefix(PREFIX + "Second program.")
    assert handle is not None and backend.supports_pin
    assert info(server)["num_pins"] == 1
    backend.unpin(handle)
    assert info(server)["num_pins"] == 0
