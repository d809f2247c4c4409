"""Keys reach the replicas and the router by environment, never by command line (/proc/<pid>/cmdline
is readable by every local user): dp_launch's replica argv and router argv, and router_main's
hand-over to the gateway (smg or sglang-router). No process is started (Popen is recorded)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.serving.launch import dp_launch, router_main

API, ADMIN = "api-key-in-no-argv-1", "admin-key-in-no-argv-2"


class Recorded:
    calls: list = []

    def __init__(self, args, env=None, **kw):
        Recorded.calls.append((list(args), dict(env or {})))


def test_replica_argv_has_no_key_and_its_environment_has_both():
    config = ServerConfig(api_key=API, admin_api_key=ADMIN, dp_size=2, max_running_requests=9)
    args = dp_launch.replica_args(config, 31000)
    assert "--max-running-requests" in args  # the rest of the config travels
    assert not [a for a in args if API in a or ADMIN in a or "api-key" in a]
    env = dp_launch.replica_env(config)
    assert env["RADIXRT_API_KEY"] == API and env["RADIXRT_ADMIN_API_KEY"] == ADMIN


def test_started_servers_and_router_carry_keys_in_the_environment(monkeypatch):
    monkeypatch.setattr(dp_launch.subprocess, "Popen", Recorded)
    Recorded.calls = []
    config = ServerConfig(api_key=API, admin_api_key=ADMIN, dp_size=2)
    dp_launch.start_servers([config, config], [])
    dp_launch.start_router(config, ["--worker-urls", "http://127.0.0.1:1"])
    assert len(Recorded.calls) == 3
    for args, _ in Recorded.calls:
        assert not [a for a in args if API in a or ADMIN in a], args
    (_, replica_env), router = Recorded.calls[0], Recorded.calls[2]
    assert replica_env["RADIXRT_API_KEY"] == API and replica_env["RADIXRT_ADMIN_API_KEY"] == ADMIN
    assert router[0][:4] == [
        sys.executable,
        "-m",
        "radixrt.runtime.serving.launch.router_main",
        "smg",
    ]
    # the router needs the API key (it asks clients for it); the admin key is not its to hold
    assert router[1][router_main.ROUTER_KEY_ENV] == API and ADMIN not in router[1].values()
    Recorded.calls = []
    dp_launch.start_router(ServerConfig(dp_size=2), [])
    assert router_main.ROUTER_KEY_ENV not in Recorded.calls[0][1]


@pytest.mark.parametrize("backend", sorted(router_main.ROUTER_BACKENDS))
def test_router_main_hands_the_key_to_the_gateway_in_process(monkeypatch, backend):
    package, module = router_main.ROUTER_BACKENDS[backend]
    pytest.importorskip(package)
    seen = []
    # the gateway's launcher itself (its import alone takes seconds) is replaced
    fake = types.ModuleType(module)
    fake.main = lambda: seen.append(list(sys.argv))
    monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(sys, "argv", ["router_main", backend, "--port", "1"])
    monkeypatch.setenv(router_main.ROUTER_KEY_ENV, API)
    router_main.main()
    assert seen == [["router_main", "--port", "1", "--api-key", API]]
    assert router_main.ROUTER_KEY_ENV not in os.environ  # not inherited further


def test_router_main_refuses_an_unknown_backend(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["router_main", "--port", "1"])
    with pytest.raises(SystemExit, match="first argument"):
        router_main.main()
