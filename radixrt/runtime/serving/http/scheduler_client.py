"""The main process's client of the scheduler: the sockets, each text delta routed to its request's
queue, the heartbeat the watchdog (launch.py) reads, admin round trips (answers of one type come
back in order) and health probes, and failing every request at once when a child process died.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from radixrt.runtime import messages
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import (
    AbortReq,
    BatchTextOut,
    CacheTreeOut,
    FlushCacheOut,
    FlushCacheReq,
    GetCacheTreeReq,
    GetServerInfoReq,
    HealthCheckOut,
    HealthCheckReq,
    LoraAdapterOut,
    LoraAdapterReq,
    ProfileOut,
    ProfileReq,
    SchedulerInfo,
)
from radixrt.runtime.processes import wait_for_children
from radixrt.runtime.serving.http.metrics import ServerMetrics
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.http.request_handle import ReqState
from radixrt.runtime.serving.http.tenants import reported_cached_tokens

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_PROBE_ID = -1  # health probes of /health count up from 0


class SchedulerClient:
    """The sockets to the scheduler and what travels on them. TokenizerManager holds one (its
    .scheduler) beside the tokenizer and the checks that make requests."""

    def __init__(
        self,
        config: ServerConfig,
        scheduler_path: str,
        tokenizer_path: str,
        metrics: ServerMetrics | None = None,
    ):
        self.config = config
        self.scheduler_path = scheduler_path
        self.tokenizer_path = tokenizer_path
        self.metrics = metrics or ServerMetrics()
        self.model_info: dict[str, Any] = {}
        self.startup_server_info: dict[str, Any] = {}
        self.lora_adapters: list[str] = []  # the LoRA adapters served (kept by lora_adapter)
        self.states: dict[str, ReqState] = {}
        self.dead_reason: str | None = None  # set by the watchdog when a child process died
        # admin round trips, by the type of their answer (answers of one type come back in order)
        self._waiters: dict[type, collections.deque[asyncio.Future]] = {
            t: collections.deque()
            for t in (SchedulerInfo, FlushCacheOut, CacheTreeOut, ProfileOut, LoraAdapterOut)
        }
        self._health_waiters: dict[int, asyncio.Future] = {}
        self._probe_ids = itertools.count()
        self._recv_task: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self.last_heartbeat = time.monotonic()  # the scheduler loop's last answer to anything

    # ------------------------------------------------------------------ lifecycle
    async def connect(self, procs: dict[str, Any], timeout: float) -> None:
        """Open the sockets and wait until every child process is ready (model load: 10-40 s)."""
        self._actx = zmq.asyncio.Context()
        self._pull = self._actx.socket(zmq.PULL)
        self._pull.bind(self.tokenizer_path)
        # Sends go through a plain socket: they never await, so aborts work inside a cancelled task.
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.connect(self.scheduler_path)
        info = await wait_for_children(self._pull, procs, timeout)
        self.model_info = info["scheduler"]["model_info"]
        self.startup_server_info = info["scheduler"]["server_info"]
        self.lora_adapters = list(self.startup_server_info.get("lora_adapters", []))

    def start_loops(self) -> None:
        """From now on, route what the scheduler sends and probe its loop every heartbeat."""
        self._recv_task = asyncio.create_task(self._recv_loop())
        self.last_heartbeat = time.monotonic()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())

    async def close(self) -> None:
        for task in (self._recv_task, self._heartbeat_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for sock in (getattr(self, "_pull", None), getattr(self, "_push", None)):
            if sock is not None:
                sock.close(linger=0)
        for ctx in (getattr(self, "_actx", None), getattr(self, "_ctx", None)):
            if ctx is not None:
                ctx.term()

    def _send(self, msg: Any) -> None:
        self._push.send(messages.encode(msg))

    def send_admin(self, msg: Any) -> None:
        """A one-way message to the scheduler (e.g. UnpinReq)."""
        self._send(msg)

    def send_frames(self, frames: list[bytes]) -> None:
        """Messages already encoded (TokenizerManager.generate encodes a request's all first)."""
        for frame in frames:
            self._push.send(frame)

    async def _recv_loop(self) -> None:
        while True:
            msg = messages.decode(await self._pull.recv())
            if isinstance(msg, BatchTextOut):
                self._dispatch(messages.output_dicts(msg))
            elif type(msg) in self._waiters:
                if isinstance(msg, SchedulerInfo):
                    self.last_heartbeat = time.monotonic()
                _resolve_next(self._waiters[type(msg)], msg)
            elif isinstance(msg, HealthCheckOut):
                self.last_heartbeat = time.monotonic()
                fut = self._health_waiters.pop(msg.probe_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(True)
            else:
                logger.warning("unexpected message %s", type(msg).__name__)

    async def _heartbeat_loop(self) -> None:
        """Probe the scheduler loop every HEARTBEAT_INTERVAL_S; it answers between steps. The
        watchdog (launch.py) reads last_heartbeat: a loop that stops answering is a hung
        scheduler."""
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            if self.dead_reason is None:
                self._send(HealthCheckReq(probe_id=HEARTBEAT_PROBE_ID))

    def heartbeat_age(self) -> float:
        return time.monotonic() - self.last_heartbeat

    def _dispatch(self, outputs: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        page_size = int(self.startup_server_info.get("page_size", 1))
        for out in outputs:
            st = self.states.get(out["rid"])
            if st is None:  # aborted by us, or the answer to a request that timed out
                continue
            # what a client (and /metrics) is told: no oracle of others' prompts (tenants.py)
            out["cached_tokens"] = reported_cached_tokens(
                out.get("cached_tokens", 0), page_size, self.config.enable_cache_report
            )
            num_new = len(out["new_ids"])
            if num_new and st.stream:
                if st.last_token_time is None:
                    self.metrics.on_first_token(now - st.created)
                else:
                    self.metrics.on_next_tokens(now - st.last_token_time, num_new)
                st.last_token_time = now
            if out.get("abort_scheduler") and self.dead_reason is None:
                # the detokenizer failed it; the scheduler still runs it
                self._send(AbortReq(rid=st.rid))
            if out.get("finished_reason") is not None:
                del self.states[st.rid]
                self.metrics.on_finish(out, now - st.created)
            st.queue.put_nowait((st.index, out))
        self.metrics.inflight.set(len(self.states))

    def fail_all(self, reason: str) -> None:
        """A child process died: end every request now with a server error."""
        self.dead_reason = reason
        for st in list(self.states.values()):
            st.queue.put_nowait(
                (
                    st.index,
                    {
                        "rid": st.rid,
                        "new_ids": [],
                        "text": "",
                        "error": reason,
                        "finished_reason": {"type": "abort", "message": reason},
                        "server_error": True,
                    },
                )
            )
        self.states.clear()
        for fut in [*itertools.chain(*self._waiters.values()), *self._health_waiters.values()]:
            if not fut.done():
                fut.set_exception(APIError(reason, 503, "server_error"))

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise APIError(f"the server is shutting down: {self.dead_reason}", 503, "server_error")

    def abort(self, rid: str) -> None:
        if self.states.pop(rid, None) is not None and self.dead_reason is None:
            self._send(AbortReq(rid=rid))

    # ------------------------------------------------------------------ admin round trips
    async def _ask(self, msg: Any, answer: type, timeout: float) -> Any:
        self.check_alive()
        fut = asyncio.get_running_loop().create_future()
        # answers come back in order; a late answer still resolves its own future
        self._waiters[answer].append(fut)
        self._send(msg)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            raise APIError(
                f"the scheduler did not answer within {timeout:.0f} s", 503, "server_error"
            ) from None

    async def server_info(self, timeout: float = 30.0) -> dict[str, Any]:
        return (await self._ask(GetServerInfoReq(), SchedulerInfo, timeout)).info

    async def flush_cache(self, timeout: float = 30.0) -> bool:
        return (await self._ask(FlushCacheReq(), FlushCacheOut, timeout)).success

    async def cache_view(self, max_depth: int, max_nodes: int, timeout: float = 30.0) -> dict:
        """The scheduler's cache view, token ids only (TokenizerManager.cache_tree adds text)."""
        req = GetCacheTreeReq(max_depth=max_depth, max_nodes=max_nodes)
        return (await self._ask(req, CacheTreeOut, timeout)).view

    async def profile(self, req: ProfileReq, timeout: float = 60.0) -> ProfileOut:
        return await self._ask(req, ProfileOut, timeout)

    async def lora_adapter(self, req: LoraAdapterReq, timeout: float = 120.0) -> LoraAdapterOut:
        """Load or unload an adapter in the scheduler; the adapters served afterwards are kept."""
        out = await self._ask(req, LoraAdapterOut, timeout)
        self.lora_adapters = list(out.adapters)
        return out

    async def health_probe(self, timeout: float = 20.0) -> bool:
        """True when the scheduler answers a probe in time (one scheduler step at most)."""
        if self.dead_reason is not None:
            return False
        probe_id = next(self._probe_ids)
        fut = asyncio.get_running_loop().create_future()
        self._health_waiters[probe_id] = fut
        self._send(HealthCheckReq(probe_id=probe_id))
        try:
            return await asyncio.wait_for(fut, timeout)
        except (asyncio.TimeoutError, APIError):
            self._health_waiters.pop(probe_id, None)
            return False


def _resolve_next(waiters: collections.deque, value: Any) -> None:
    if waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(value)
