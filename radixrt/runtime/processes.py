"""OS processes: parent-death signal, stop flag, waiting for children, a free port, waiting for a
server's health.

What every child process of `radixrt serve` shares (dying with the parent, stopping between loop
iterations, the ready handshake), and what starts a server as a subprocess and waits for it (the
DSL's Runtime, `--dp-size` replicas, tests and benchmarks). Below serving/, model/ and frontend/, so
each may import it: it imports nothing of radixrt at module level, and never torch.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable

logger = logging.getLogger("radixrt.server")


def set_parent_death_signal() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphans even after a SIGKILL)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the ppid check in the loops still catches it
        pass


class StopFlag:
    """In a child: SIGINT is ignored (Ctrl-C reaches the whole process group; the parent stops us).
    SIGTERM kills at once while starting (a model load cannot be interrupted politely); once the
    loop runs (`enter_loop`) it only sets a flag, so the loop ends between steps and closes its
    sockets."""

    def __init__(self) -> None:
        self.stop = False
        self.parent_pid = os.getppid()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def enter_loop(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop = True

    def should_stop(self) -> bool:
        return self.stop or os.getppid() != self.parent_pid

    @staticmethod
    def exit_now() -> None:
        """Leave without interpreter teardown: garbage-collecting torch/transformers can take
        seconds on a busy machine, and the sockets are already closed."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


async def wait_for_children(pull: Any, procs: dict[str, Any], timeout: float) -> dict[str, dict]:
    """Wait until every child reported ready on pull (an asyncio zmq socket); their info by name.
    Fails fast when one reports a failure or exits while starting."""
    from radixrt.runtime import messages
    from radixrt.runtime.messages import ProcessFailed, ProcessReady

    deadline = time.monotonic() + timeout
    info: dict[str, dict] = {}
    while len(info) < len(procs):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{', '.join(sorted(set(procs) - set(info)))} not ready after {timeout:.0f} s"
            )
        if not await pull.poll(500):
            for name, proc in procs.items():
                if not proc.is_alive():
                    raise RuntimeError(
                        f"the {name} process exited with code {proc.exitcode} while starting"
                    )
            continue
        msg = messages.decode(await pull.recv())
        if isinstance(msg, ProcessFailed):
            raise RuntimeError(f"the {msg.name} process failed to start: {msg.error}")
        if isinstance(msg, ProcessReady):
            logger.info("%s process ready", msg.name)
            info[msg.name] = msg.info
    return info


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(
    url: str,
    process: subprocess.Popen,
    timeout: float,
    poll_s: float = 0.25,
    log_tail: Callable[[], str] = lambda: "",
) -> None:
    """Poll `url`/health until it answers 200. RuntimeError if the process exits first, TimeoutError
    after `timeout` s; both end with `log_tail()`, the server's last words."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"`radixrt serve` exited with code {process.returncode} before it was ready:\n"
                f"{log_tail()}"
            )
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(poll_s)
    raise TimeoutError(
        f"`radixrt serve` on {url} was not healthy after {timeout:.0f} s:\n{log_tail()}"
    )
