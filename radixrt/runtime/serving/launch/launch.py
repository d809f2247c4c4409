"""Start, watch and stop the three processes of `radixrt serve`.

The main process runs uvicorn + the tokenizer manager; the scheduler and the detokenizer are
spawned ("spawn": torch and fork do not mix) and joined by ZeroMQ ipc:// sockets in a private
temp dir (mode 0700). Start-up waits for both children to report ready. A watchdog notices a
dead child: in-flight requests fail at once, /health turns 503, the server exits non-zero.
Ctrl-C / SIGTERM stop admitting, let running requests finish (at most DRAIN_TIMEOUT_S), then stop
everything; no process or socket file outlives the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import shutil
import signal
import tempfile
import threading
from typing import Any

logger = logging.getLogger("radixrt.server")

WATCHDOG_INTERVAL_S = 0.25
STOP_TIMEOUT_S = 5.0
# SIGTERM: uvicorn stops accepting, then waits this long for running requests to finish before
# cancelling them (a generation of a few hundred tokens on a CPU takes tens of seconds).
DRAIN_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class IpcPaths:
    dir: str
    scheduler: str  # scheduler's PULL: requests, aborts, admin queries
    detokenizer: str  # detokenizer's PULL: token deltas
    tokenizer: str  # tokenizer manager's PULL: text deltas, admin answers, ready reports

    @classmethod
    def create(cls) -> "IpcPaths":
        # mkdtemp makes it 0700: other users cannot connect
        d = tempfile.mkdtemp(prefix="radixrt-ipc-")
        os.chmod(d, 0o700)
        return cls(d, f"ipc://{d}/scheduler", f"ipc://{d}/detokenizer", f"ipc://{d}/tokenizer")


def served_model_name(model_path: str | None) -> str:
    if model_path is None:
        from radixrt.runtime.model.weights import DEFAULT_GGUF_NAME

        return DEFAULT_GGUF_NAME.split(".")[0]
    name = pathlib.Path(model_path).name
    return name[:-5] if name.lower().endswith(".gguf") else name


def stop_processes(procs: dict[str, Any]) -> None:
    for p in procs.values():
        if p.is_alive():
            p.terminate()
    for name, p in procs.items():
        if p.pid is None:
            continue
        p.join(STOP_TIMEOUT_S)
        if p.is_alive():
            logger.warning("%s did not stop within %.0f s; killing it", name, STOP_TIMEOUT_S)
            p.kill()
            p.join()
    _stop_resource_tracker()


def _stop_resource_tracker() -> None:
    """multiprocessing's resource tracker (started by "spawn") would otherwise exit only after this
    process does, when its pipe closes: stop it now so that no process outlives the server."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # private, present since 3.8
    if stop is None:
        return

    def stop_quietly() -> None:
        try:
            stop()
        except (OSError, ChildProcessError):
            pass

    # it waits for the tracker, which waits for every holder of its pipe: never hang the stop on it
    waiter = threading.Thread(target=stop_quietly, name="stop-resource-tracker", daemon=True)
    waiter.start()
    waiter.join(STOP_TIMEOUT_S)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def launch_server(config: Any, scheduler_class: str | None = None) -> int:
    """Run `radixrt serve` until stopped; returns the exit code (non-zero when a child died)."""
    import multiprocessing as mp

    from radixrt.runtime.model.weights import resolve_model
    from radixrt.runtime.serving.backend.detokenizer import run_detokenizer_process
    from radixrt.runtime.serving.backend.scheduler_process import (
        DEFAULT_SCHEDULER_CLASS,
        run_scheduler_process,
    )

    logging.basicConfig(
        level=config.log_level.upper(), format="[server] %(asctime)s %(levelname)s %(message)s"
    )
    name = served_model_name(config.model_path)
    # converts a GGUF once
    config = config.replace(model_path=str(resolve_model(config.model_path)))
    ipc = IpcPaths.create()
    procs: dict[str, Any] = {}
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        ctx = mp.get_context("spawn")
        procs["scheduler"] = ctx.Process(
            target=run_scheduler_process,
            name="radixrt-scheduler",
            args=(
                dataclasses.asdict(config),
                ipc.scheduler,
                ipc.detokenizer,
                ipc.tokenizer,
                scheduler_class or DEFAULT_SCHEDULER_CLASS,
            ),
        )
        procs["detokenizer"] = ctx.Process(
            target=run_detokenizer_process,
            name="radixrt-detokenizer",
            args=(config.model_path, ipc.detokenizer, ipc.tokenizer, config.log_level),
        )
        for p in procs.values():
            p.start()
        return asyncio.run(_serve(config, ipc, procs, name))
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as e:  # a child could not start
        logger.error("%s", e)
        return 1
    finally:
        # a second signal (Ctrl-C pressed again, a SIGTERM to the process group) must not break the
        # cleanup
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        logger.info("stopping")
        stop_processes(procs)
        shutil.rmtree(ipc.dir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


async def _serve(config: Any, ipc: IpcPaths, procs: dict[str, Any], name: str) -> int:
    import uvicorn

    from radixrt.runtime.serving.http.http_app import create_app
    from radixrt.runtime.serving.http.metrics import ServerMetrics
    from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

    tm = TokenizerManager(config, ipc.scheduler, ipc.tokenizer, ServerMetrics())
    watchdog: asyncio.Task | None = None
    try:
        await tm.start(procs)
        app = create_app(tm, name)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=config.host,
                port=config.port,
                log_level=config.log_level,
                access_log=config.log_level == "debug",
                timeout_graceful_shutdown=DRAIN_TIMEOUT_S,
                lifespan="off",
            )
        )
        failed: list[str] = []
        watchdog = asyncio.create_task(_watchdog(tm.scheduler, procs, server, failed))
        logger.info("serving %s on http://%s:%d", name, config.host, config.port)
        await server.serve()
        if not server.started and not failed:
            return 1  # could not bind the port (uvicorn logged why)
        return 1 if failed else 0
    finally:
        if watchdog is not None:
            watchdog.cancel()
        await tm.close()


async def _watchdog(scheduler: Any, procs: dict[str, Any], server: Any, failed: list[str]) -> None:
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        dead = [(n, p) for n, p in procs.items() if not p.is_alive()]
        reason = None
        if dead and (server.should_exit or dead[0][1].exitcode == 0):
            # exit code 0: a child stops so only on a signal (Ctrl-C or a SIGTERM sent to the whole
            # process group reaches it with us): a stop, not a failure; the requests still in flight
            # are told
            logger.info("the %s process was stopped; stopping", dead[0][0])
            scheduler.fail_all("the server is stopping")
            server.should_exit = True
            return
        if dead:
            n, p = dead[0]
            reason = f"the {n} process died (exit code {p.exitcode})"
        elif scheduler.heartbeat_age() > scheduler.config.watchdog_timeout:
            age = scheduler.heartbeat_age()
            reason = f"the scheduler made no progress for {age:.0f} s (watchdog_timeout)"
        if reason is not None:
            logger.error("%s: failing in-flight requests and shutting down", reason)
            failed.append(reason)
            scheduler.fail_all(reason)
            await asyncio.sleep(0.5)  # let the error answers go out before the listener closes
            server.should_exit = True
            return
