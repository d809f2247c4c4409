"""Tensor parallelism on torch.distributed (gloo on CPU, NCCL on CUDA): the process group, the
collectives the model needs, the plan broadcast, and the worker ranks.

One scheduler, on rank 0. Each step rank 0 broadcasts the forward's inputs as plain data
(core/plan.py's ForwardItem structs as MessagePack, through a torch.distributed broadcast: a length,
then the bytes; never pickle); every rank builds the same forward batch (so its req->slot table
stays identical), runs its shard of the model (models/llama.py: Megatron sharding), and the logits
are gathered to rank 0, which samples. Workers hold no scheduler state, so ranks cannot drift apart.

Failure: a rank that dies, or a collective that fails, leaves the ranks out of step for good, so it
is never a request's error: `TPFailure` (a BaseException, so no per-request recovery catches it)
ends the scheduler, and the server's watchdog fails the in-flight requests and exits non-zero. Rank
0 also watches its local workers, so a killed worker is noticed within a poll interval even while
rank 0 waits in a collective.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from radixrt.runtime.processes import free_port

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
STOP = -1  # broadcast instead of a plan length: the workers leave their loop
# workers wait for the next plan for as long as the server idles
PLAN_WAIT = datetime.timedelta(days=3650)


class TPFailure(BaseException):
    """A rank is gone or a collective failed: the ranks can no longer run in step."""


def free_init_method() -> str:
    """A rendezvous address on a free local port."""
    return f"tcp://127.0.0.1:{free_port()}"


class TPGroup:
    def __init__(
        self, rank: int, size: int, init_method: str, device: torch.device, timeout_s: float
    ):
        backend = "nccl" if device.type == "cuda" else "gloo"
        if init_method.startswith("tcp://127.0.0.1:") and os.path.exists("/sys/class/net/lo"):
            # one machine: gloo's pairs listen on loopback, not on the interface the hostname
            # resolves to (neither gloo nor the rendezvous store authenticates a peer)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        # the plan broadcast waits as long as the server is idle: its own gloo group (host tensors)
        # without a practical deadline; the forward's collectives keep timeout_s
        self.plan_group = dist.new_group(backend="gloo", timeout=PLAN_WAIT)
        self.rank, self.size, self.device = rank, size, device

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # a peer died (connection closed) or timed out
            raise TPFailure(f"tensor parallel {what} failed on rank {self.rank}: {e}") from None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place."""
        self._call("all_reduce", lambda: dist.all_reduce(x))
        return x

    def min_int(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        self._call("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN))
        return int(t.item())

    def gather_last_dim(self, local: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: the ranks' slices concatenated along the last dim (vocab-parallel logits); others
        None."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)] if self.rank == 0 else None
        self._call("gather", lambda: dist.gather(local, parts, dst=0))
        return torch.cat(parts, dim=-1) if parts is not None else None

    def broadcast_bytes(self, data: bytes | None = None) -> bytes | None:
        """Rank 0 sends data (None = STOP); every rank returns it (None on STOP)."""
        if self.rank == 0:
            length = torch.tensor([len(data) if data is not None else STOP], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self._call("broadcast", lambda: dist.broadcast(length, src=0, group=self.plan_group))
        n = int(length.item())
        if n == STOP:
            return None
        buf = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.rank == 0
            else torch.empty(n, dtype=torch.uint8)
        )
        self._call("broadcast", lambda: dist.broadcast(buf, src=0, group=self.plan_group))
        return data if self.rank == 0 else buf.numpy().tobytes()

    def close(self) -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group has nothing left to tear down cleanly
            pass


def local_worker_ranks(config: Any) -> list[int]:
    """The ranks this node runs in worker processes (rank 0, on node 0, is the scheduler's own)."""
    per_node = config.tp_size // config.nnodes
    first = config.node_rank * per_node
    return [r for r in range(first, first + per_node) if r != 0]


def init_method_of(config: Any) -> str:
    return f"tcp://{config.dist_init_addr}" if config.dist_init_addr else free_init_method()


def start_workers(config: Any, init_method: str) -> list[subprocess.Popen]:
    """Start this node's worker ranks (they load the model and wait for rank 0's plans). Plain
    subprocesses of `python -m radixrt.runtime.model.tp_worker`, not multiprocessing: spawning
    re-imports the user's main module, which an Engine(tp_size=2) script without an
    `if __name__ == "__main__"` guard cannot survive."""
    import dataclasses

    procs = []
    for rank in local_worker_ranks(config):
        args = [
            sys.executable,
            "-m",
            "radixrt.runtime.model.tp_worker",
            str(rank),
            init_method,
            json.dumps(dataclasses.asdict(config)),
        ]
        procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL))
    return procs


def watch_workers(
    procs: list[subprocess.Popen], on_death: Callable[[str], None]
) -> Callable[[], None]:
    """A thread that calls on_death(reason) when a worker exits; returns a function that stops
    watching."""
    stopped = threading.Event()

    def loop() -> None:
        while not stopped.wait(WATCH_INTERVAL_S):
            for p in procs:
                if p.poll() is not None:
                    on_death(f"tensor parallel worker pid {p.pid} exited with code {p.returncode}")
                    return

    threading.Thread(target=loop, name="radixrt-tp-watch", daemon=True).start()
    return stopped.set


def stop_workers(group: TPGroup | None, procs: list[Any], timeout: float = 10.0) -> None:
    if group is not None:
        try:
            group.broadcast_bytes(None)
        except TPFailure:
            pass
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_headless_node(config: Any) -> int:
    """`radixrt serve --nnodes N --node-rank k` (k > 0): this node's ranks, no HTTP; exits when they
    do."""
    procs = start_workers(config, init_method_of(config))
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
