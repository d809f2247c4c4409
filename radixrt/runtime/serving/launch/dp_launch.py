"""`radixrt serve --dp-size N`: N replicas behind a gateway (--router-backend: smg, the SGLang
Model Gateway, by default; `pip install smg`, the `[router]` extra), on the user's port with the
cache-aware policy (`--router-policy`, default cache_aware): requests that share a prefix go to the
replica that already holds it.

Each replica is a plain `radixrt serve` subprocess on a free local port with its share of the CPU
threads; the gateway is `python -m smg.launch_router` (or `sglang_router.launch_router`, the same
flags) on --host/--port with --worker-urls. The replicas answer what the gateway asks of a worker
(/health, /get_model_info, /get_server_info, /v1/models). A replica or the gateway that dies is
reported; the gateway routes around a dead replica (its health checks), and the whole server exits
non-zero when the gateway dies or every replica is gone. SIGTERM / Ctrl-C stop everything. Replicas
on other machines: start `radixrt serve` there and run the gateway yourself with their URLs
(`python -m smg.launch_router --worker-urls http://a:30000 http://b:30000 --policy cache_aware`).
serve_behind_router is also --pd's (pd_launch.py): the same supervision around a prefill and a
decode server.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from radixrt.runtime.config_checks import SECRET_ENVS
from radixrt.runtime.processes import free_port, set_parent_death_signal, wait_until_healthy
from radixrt.runtime.serving.launch.router_main import (
    DROPPED_BY_SGLANG_ROUTER,
    ROUTER_BACKENDS,
    ROUTER_KEY_ENV,
)

logger = logging.getLogger("radixrt.server")
POLL_S = 0.5


def router_available(backend: str = "smg") -> bool:
    return importlib.util.find_spec(ROUTER_BACKENDS[backend][0]) is not None


def replica_args(config: Any, port: int) -> list[str]:
    """The `radixrt serve` command line of one replica: the same config, dp_size 1, on
    localhost:port."""
    from radixrt.runtime.config import ServerConfig

    args = [sys.executable, "-m", "radixrt.cli", "serve"]
    defaults = ServerConfig()
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if (
            f.name
            in ("dp_size", "host", "port", "router_policy", "router_backend", "pd", *SECRET_ENVS)
            or value == getattr(defaults, f.name)
            or value is None
        ):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{f.name.replace('_', '-')}")
        elif isinstance(value, tuple):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args + ["--host", "127.0.0.1", "--port", str(port)]


def replica_env(config: Any) -> dict[str, str]:
    """The keys of a replica's command line, handed over in its environment instead (argv is
    readable by every local user in /proc)."""
    return {
        env: getattr(config, name)
        for name, env in SECRET_ENVS.items()
        if getattr(config, name, None) is not None
    }


def launch_dp(config: Any) -> int:
    return serve_behind_router(
        config,
        "--dp-size > 1",
        [config] * config.dp_size,
        lambda urls: ["--policy", config.router_policy, "--worker-urls", *urls],
    )


def serve_behind_router(
    config: Any,
    what: str,
    configs: list[Any],
    router_flags: Callable[[list[str]], list[str]],
    each_needed: bool = False,
    startup_timeout: float = 900.0,
) -> int:
    """One `radixrt serve` per entry of configs on a free local port, the cores shared among them,
    then the gateway on --host/--port with router_flags(their urls); supervised until a stop or
    a failure (each_needed: any server's death ends it). Returns the exit code."""
    backend = config.router_backend
    if not router_available(backend):
        raise SystemExit(
            f"{what} needs a gateway in front of the servers: pip install {backend}"
            + (" (or pip install 'radixrt[router]')" if backend == "smg" else "")
        )
    if backend == "sglang-router":
        logger.warning(
            "sglang-router drops %s: behind it, tenants share one cache and sessions do not "
            "reach the servers (--router-backend smg passes every field through)",
            "; ".join(f"{', '.join(v)} on {k}" for k, v in DROPPED_BY_SGLANG_ROUTER.items()),
        )
    servers: list[tuple[str, subprocess.Popen]] = []
    router = None
    stopping = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    previous_int = signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    try:
        start_servers(configs, servers)
        for url, proc in servers:
            wait_until_healthy(url, proc, startup_timeout)
        urls = [u for u, _ in servers]
        router = start_router(config, router_flags(urls))
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
        key = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        wait_until_routing(f"http://{host}:{config.port}", key, router, startup_timeout)
        logger.info(
            "%s: %s behind %s on %s:%d", what, " ".join(urls), backend, config.host, config.port
        )
        return supervise(router, servers, stopping, each_needed)
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as e:  # a server died or never became healthy
        logger.error("%s", e)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not break the cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        logger.info("stopping")
        stop_all([p for _, p in servers] + ([router] if router is not None else []))
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def wait_until_routing(
    url: str, headers: dict[str, str], proc: subprocess.Popen, timeout: float
) -> None:
    """Until the gateway at url lists a model on /v1/models: it answers /health before it has
    learnt its workers' models, and a request in that moment is a 404 ("No worker available").
    It asks /readiness first (200 once a worker is healthy, in smg and sglang-router) because
    smg logs every 503 from /v1/models as an ERROR, and a clean start should log none.
    proc: the process whose exit ends the wait (the gateway, or a launcher in front of it)."""
    import requests  # a dependency (wait_until_healthy's too)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pid {proc.pid} exited with code {proc.returncode} at start")
        try:
            ready = requests.get(url + "/readiness", headers=headers, timeout=5)
            if ready.status_code in (200, 404):  # 404: a gateway without the route
                got = requests.get(url + "/v1/models", headers=headers, timeout=5)
                if got.status_code == 200 and got.json().get("data"):
                    return
        except (requests.RequestException, ValueError):
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"the gateway on {url} listed no model in {timeout:.0f} s")


def start_servers(configs: list[Any], servers: list[tuple[str, subprocess.Popen]]) -> None:
    """Start one server per config on a free port, each added to `servers` (url, process) as it
    starts, so the caller stops those already running if a later one cannot start."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // len(configs))),
    }  # the servers share the cores
    for cfg in configs:
        port = free_port()
        proc = subprocess.Popen(replica_args(cfg, port), env={**env, **replica_env(cfg)})
        servers.append((f"http://127.0.0.1:{port}", proc))


def start_router(config: Any, workers: list[str]) -> subprocess.Popen:
    """The gateway (--router-backend) on --host/--port in front of the servers (workers: its flags
    naming them). With --api-key, it asks its clients for the key and presents it to the servers
    (a PD pair takes bootstrap fields only with it); router_main.py hands it over in the
    environment."""
    key_env = {} if config.api_key is None else {ROUTER_KEY_ENV: config.api_key}
    backend_flags = []
    if config.router_backend == "smg":
        from radixrt.runtime.serving.launch.launch import served_model_name

        backend_flags = [
            # smg would fetch the served model's tokenizer from the Hub for its own tokenizing
            # routes; HTTP workers tokenize themselves, and nothing is downloaded at run time
            "--disable-tokenizer-autoload",
            # smg routes by the body's model among the names the workers list (/v1/models); the
            # servers also answer to "default", as SGLang's do
            "--model-alias",
            f"default={served_model_name(config.model_path)}",
        ]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixrt.runtime.serving.launch.router_main",
            config.router_backend,
            *backend_flags,
            "--host",
            config.host,
            "--port",
            str(config.port),
            "--prometheus-port",
            str(free_port()),  # its default port may be taken
            *workers,
            "--log-level",
            "warn",
        ],
        env={**os.environ, **key_env},
        # its own session: Ctrl-C in the terminal would reach it with the rest of the
        # group, and the gateway's Python wrapper dies of it with a traceback; we stop
        # it with SIGTERM, and it still dies with us (parent-death signal)
        start_new_session=True,
        preexec_fn=set_parent_death_signal,
    )


def supervise(
    router: subprocess.Popen,
    replicas: list[tuple[str, subprocess.Popen]],
    stopping: list,
    each_needed: bool = False,
) -> int:
    """Watch the router and the replicas until a stop (`stopping` non-empty) or a failure; the exit
    code. A dead replica is reported once (the router routes around it); the router's death, or
    every replica's (each_needed: any one's), ends the server with 1."""
    dead: set[str] = set()
    while not stopping:
        if router.poll() is not None:
            logger.error("the router exited with %s", router.returncode)
            return 1
        for url, proc in replicas:
            if proc.poll() is not None and url not in dead:
                # a replica exits 0 only when stopped (a signal to the group)
                if proc.returncode == 0:
                    logger.info("replica %s was stopped; stopping", url)
                    return 0
                dead.add(url)
                logger.error(
                    "replica %s exited with %s; the router routes around it",
                    url,
                    proc.returncode,
                )
        if len(dead) == len(replicas) or (dead and each_needed):
            logger.error("every replica is gone" if not each_needed else "a server is gone")
            return 1
        time.sleep(POLL_S)
    return 0


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process still running, then wait for each (SIGKILL after 30 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
