"""A really launched `radixrt serve` for tests: a subprocess on a free port, waited on until /health
answers, with its temp dir (where its ipc sockets live) under the test's tmp path so a test can
check that nothing is left behind."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil

from radixrt.runtime.processes import free_port, wait_until_healthy  # noqa: F401 (tests import free_port here)
from radixrt.runtime.serving.launch.dp_launch import wait_until_routing

STARTUP_TIMEOUT_S = 420  # model load is 10-40 s alone; several parallel test sessions slow it a lot
HERE = pathlib.Path(__file__).parent


class ServerProcess:
    def __init__(
        self,
        args: list[str],
        tmp_dir: pathlib.Path,
        fake_scheduler: bool = False,
        env: dict[str, str] | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp_dir = pathlib.Path(tmp_dir)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.tmp_dir / "server.log"
        env = {**os.environ, "TMPDIR": str(self.tmp_dir), "PYTHONUNBUFFERED": "1", **(env or {})}
        # token-exact checks run in float32; the default dtype has its own test
        if "--dtype" not in args:
            args = [*args, "--dtype", "float32"]
        # tests check cached_tokens exactly; the default's rounding is test_tenant_battery's
        if not any(a.endswith("enable-cache-report") for a in args):
            args = [*args, "--enable-cache-report"]
        cmd = [sys.executable, "-m", "radixrt.cli", "serve", "--port", str(self.port), *args]
        if fake_scheduler:
            env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
            cmd += ["--scheduler-class", "server_fake_scheduler:FakeScheduler"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.ps = psutil.Process(self.proc.pid)
        self._wait_healthy()
        if "--dp-size" in args or "--pd" in args:  # a gateway in front
            key = env.get("RADIXRT_API_KEY")
            auth = {"Authorization": f"Bearer {key}"} if key else {}
            wait_until_routing(self.url, auth, self.proc, STARTUP_TIMEOUT_S)
        self.child_pids = [c.pid for c in self.ps.children(recursive=True)]

    def _wait_healthy(self) -> None:
        try:
            wait_until_healthy(
                self.url, self.proc, STARTUP_TIMEOUT_S, poll_s=0.5, log_tail=self.log
            )
        except TimeoutError:
            self.stop(signal.SIGKILL)
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def ipc_leftovers(self) -> list[str]:
        return [str(p) for p in self.tmp_dir.glob("radixrt-ipc-*")]

    def alive_pids(self) -> list[int]:
        return [
            p
            for p in [self.proc.pid, *self.child_pids]
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for pid in self.alive_pids():  # only our own processes, by pid
                    os.kill(pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def inflight_then(
    url: str, trigger_text: str, max_new_tokens: int = 200, timeout: float = 30
) -> list:
    """A plain and a streamed /generate in flight, then a request with trigger_text (a fake scheduler's
    CRASH or HANG): the three outcomes (response, SSE payloads, response), or the exception each raised."""
    import asyncio

    import httpx

    async def run():
        async with httpx.AsyncClient(timeout=timeout) as client:
            body = {"text": "slow one", "sampling_params": {"max_new_tokens": max_new_tokens}}
            plain = asyncio.create_task(client.post(url + "/generate", json=body))

            async def streamed() -> list[str]:
                async with client.stream(
                    "POST", url + "/generate", json={**body, "stream": True}
                ) as r:
                    return sse_events([line async for line in r.aiter_lines()])

            streaming = asyncio.create_task(streamed())
            await asyncio.sleep(0.5)
            trigger = asyncio.create_task(
                client.post(url + "/generate", json={"text": trigger_text})
            )
            return await asyncio.gather(plain, streaming, trigger, return_exceptions=True)

    return asyncio.run(run())


def sse_events(lines: list[str]) -> list[str]:
    """The data payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


class SharedServers:
    """Servers shared by every test file that starts one with the same flags (the session-scoped
    `shared_servers` fixture of tests/integration/conftest.py): a real server costs 10-40 s to
    start on 2 cores, and most files only need one that serves. A file takes one with
    `shared_servers.get(args)`; the first caller starts it and the session's end stops it. Each
    taker gets it with its radix cache flushed and its integrity checked (a file's "first request
    is a miss" holds as on a fresh server); what a file may not share (a killed server, a fake
    scheduler, a pool it fills on purpose, counters it reads as totals) stays its own server."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.servers: dict[tuple[str, ...], ServerProcess] = {}

    def get(self, args: list[str]) -> ServerProcess:
        import httpx

        key = tuple(args)
        srv = self.servers.get(key)
        if srv is not None and srv.proc.poll() is not None:
            raise AssertionError(f"a shared server exited ({srv.proc.returncode}):\n{srv.log()}")
        if srv is None:
            srv = ServerProcess(list(args), self.tmp_path_factory.mktemp("shared"))
            self.servers[key] = srv
            return srv
        # the previous taker's aborted streams may still be winding down: wait for an idle server
        deadline = time.monotonic() + 60
        while True:
            info = httpx.get(srv.url + "/get_server_info", timeout=60).json()
            if not (info["num_running"] or info["num_waiting"]) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        flushed = httpx.post(srv.url + "/flush_cache", timeout=60)
        assert flushed.status_code == 200, (flushed.text, info)  # a pin left behind refuses it
        info = httpx.get(srv.url + "/get_server_info", timeout=60).json()
        assert info["integrity_ok"] and info["kv_pages_cached"] == 0, info
        return srv

    def stop_all(self) -> None:
        for srv in self.servers.values():
            srv.stop()
        self.servers.clear()


# the shared default server: the real model in float32 (ServerProcess adds --dtype float32 and
# --enable-cache-report), a 4,096-token pool; files that need nothing else of a server take it
DEFAULT_SERVER_ARGS = ["--max-total-tokens", "4096", "--log-level", "warning"]
