"""Runtime: launch `radixrt serve` as a subprocess on a free port and use it as a backend.

    with Runtime(page_size=16) as runtime:
        state = program.run(backend=runtime)

The server (and the worker processes it starts) runs in its own process group, so
`shutdown()` stops all of them; it is also registered with atexit.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from radixrt.frontend.endpoint import RuntimeEndpoint
from radixrt.runtime.processes import free_port, wait_until_healthy


def server_command(port: int, model_path: str | None, server_args: dict[str, Any]) -> list[str]:
    """`python -m radixrt.cli serve ...` with flags from ServerConfig field names."""
    from radixrt.runtime.config import ServerConfig  # plain dataclass: no torch

    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    unknown = sorted(set(server_args) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown server argument(s): {', '.join(unknown)} (see `radixrt serve --help`)"
        )
    args = {**server_args, "host": "127.0.0.1", "port": port}
    if model_path is not None:
        args["model_path"] = model_path
    cmd = [sys.executable, "-m", "radixrt.cli", "serve"]
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if fields[name].type in ("bool", bool):
            cmd.append(flag if value else "--no-" + flag[2:])  # BooleanOptionalAction flags
        elif value is not None:
            cmd += [flag, str(value)]
    return cmd


class Runtime:
    def __init__(
        self,
        model_path: str | None = None,
        log_level: str = "error",
        launch_timeout: float = 600.0,
        **server_args: Any,
    ):
        self.port = server_args.pop("port", None) or free_port()
        self.api_key = server_args.get("api_key")
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = server_command(self.port, model_path, {**server_args, "log_level": log_level})
        self._log = tempfile.NamedTemporaryFile(
            prefix="radixrt-serve-", suffix=".log", delete=False
        )
        self.log_path = self._log.name
        self.pid: int | None = None
        self.process = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.process.pid
        atexit.register(self.shutdown)
        try:
            wait_until_healthy(self.url, self.process, launch_timeout, log_tail=self.log_tail)
            self.endpoint = RuntimeEndpoint(self.url, api_key=self.api_key)
        except BaseException:
            self.shutdown()
            raise

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-num_chars:]
        except OSError:
            return ""

    def shutdown(self) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            os.killpg(pid, signal.SIGTERM)  # the server and the processes it started
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        except ProcessLookupError:
            pass
        self._log.close()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __getattr__(self, name: str) -> Any:
        # Act as the endpoint for everything else (generate, select, flush_cache, ...).
        if name in ("endpoint", "process", "pid"):
            raise AttributeError(name)
        return getattr(self.endpoint, name)

    # SGLang's Runtime has these spelled out.
    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)
