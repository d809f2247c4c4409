"""The main process's side of the runtime: tokenize, validate, send, and route the text deltas back.

Everything that can be checked is checked here, so a bad request is a 4xx and never reaches the
scheduler. Each scheduler request (one per sequence: n>1 is expanded into rid-0..rid-{n-1})
has a state whose queue receives its text deltas; a `RequestHandle` (request_handle.py) iterates
the deltas of one HTTP request and aborts whatever is unfinished when it is closed.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
import uuid
from typing import Any

import zmq
import zmq.asyncio

from radixrt.runtime import messages
from radixrt.runtime.cache_tree_text import add_previews
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
    ProfileOut,
    ProfileReq,
    SchedulerInfo,
    TokenizedGenerateReq,
)
from radixrt.runtime.processes import wait_for_children
from radixrt.runtime.request_edge import (
    EdgeLimits,
    RequestError,
    check_prompt,
    constraint_of,
    expand_n,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.serving.metrics import ServerMetrics
from radixrt.runtime.serving.protocol import APIError, from_value_error
from radixrt.runtime.serving.request_handle import ReqState, RequestHandle

logger = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_PROBE_ID = -1  # health probes of /health count up from 0


class TokenizerManager:
    def __init__(
        self,
        config: ServerConfig,
        scheduler_path: str,
        tokenizer_path: str,
        metrics: ServerMetrics | None = None,
    ):
        from radixrt.runtime.model.weights import load_tokenizer

        self.config = config
        self.scheduler_path = scheduler_path
        self.tokenizer_path = tokenizer_path
        self.metrics = metrics or ServerMetrics()
        self.tokenizer = load_tokenizer(config.model_path)
        self.model_info: dict[str, Any] = {}
        self.startup_server_info: dict[str, Any] = {}
        self.states: dict[str, ReqState] = {}
        self.dead_reason: str | None = None  # set by the watchdog when a child process died
        self._rid_prefix = uuid.uuid4().hex[:8]
        self._rid_counter = itertools.count()
        # admin round trips, by the type of their answer (answers of one type come back in order)
        self._waiters: dict[type, collections.deque[asyncio.Future]] = {
            t: collections.deque() for t in (SchedulerInfo, FlushCacheOut, CacheTreeOut, ProfileOut)
        }
        self._health_waiters: dict[int, asyncio.Future] = {}
        self._probe_ids = itertools.count()
        self._grammar = None
        self._recv_task: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self.last_heartbeat = time.monotonic()  # the scheduler loop's last answer to anything

    # ------------------------------------------------------------------ lifecycle
    async def start(self, procs: dict[str, Any], timeout: float = 600.0) -> None:
        """Open the sockets and wait until every child process reported ready (model load: 10-40 s)."""
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
        self._grammar = await asyncio.to_thread(
            self._make_grammar_backend
        )  # ~0.5 s: walks the vocabulary
        self._recv_task = asyncio.create_task(self._recv_loop())
        self.last_heartbeat = time.monotonic()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())

    async def close(self) -> None:
        for backend in self._grammar.built() if self._grammar is not None else []:
            backend.shutdown()
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

    async def _recv_loop(self) -> None:
        while True:
            msg = messages.decode(await self._pull.recv())
            if isinstance(msg, BatchTextOut):
                self._dispatch(msg.outputs)
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
        """Probe the scheduler loop every HEARTBEAT_INTERVAL_S; it answers between steps. The watchdog
        (launch.py) reads last_heartbeat: a loop that stops answering is a hung scheduler."""
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)
            if self.dead_reason is None:
                self._send(HealthCheckReq(probe_id=HEARTBEAT_PROBE_ID))

    def heartbeat_age(self) -> float:
        return time.monotonic() - self.last_heartbeat

    def _dispatch(self, outputs: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        for out in outputs:
            st = self.states.get(out["rid"])
            if st is None:  # aborted by us, or the answer to a request that timed out
                continue
            num_new = len(out["new_ids"])
            if num_new and st.stream:
                if st.last_token_time is None:
                    self.metrics.on_first_token(now - st.created)
                else:
                    self.metrics.on_next_tokens(now - st.last_token_time, num_new)
                st.last_token_time = now
            if out.get("abort_scheduler") and self.dead_reason is None:
                self._send(
                    AbortReq(rid=st.rid)
                )  # the detokenizer failed it; the scheduler still runs it
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

    # ------------------------------------------------------------------ requests
    @property
    def context_len(self) -> int:
        return int(self.model_info["context_length"])

    @property
    def pool_tokens(self) -> int:
        info = self.startup_server_info
        return int(
            info.get("max_total_tokens") or info["kv_pages_total"] * info.get("page_size", 1)
        )

    def new_rid(self) -> str:
        return f"{self._rid_prefix}-{next(self._rid_counter)}"

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise APIError(f"the server is shutting down: {self.dead_reason}", 503, "server_error")

    async def encode(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Token ids of each text. Raw prompts (/generate, /v1/completions) pass add_special_tokens=True:
        the BOS token exactly when the tokenizer's config says to add one, as transformers does; a chat
        template's text already carries its own. Long inputs are tokenized on a worker thread so one
        huge prompt does not stall every other stream."""

        def run() -> list[list[int]]:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

        return run() if sum(len(t) for t in texts) < 20_000 else await asyncio.to_thread(run)

    async def validate_sampling(self, params: dict[str, Any] | None) -> SamplingParams:
        try:
            sp = SamplingParams.from_dict(params)
        except (ValueError, TypeError) as e:  # TypeError: a non-dict
            raise from_value_error(ValueError(str(e))) from None
        constraint = constraint_of(sp)
        if constraint is not None:
            await self._validate_constraint(*constraint)
        return sp

    def _make_grammar_backend(self) -> Any:
        """For the synchronous 400 check of a constraint (a bad one never reaches the scheduler)."""
        from radixrt.runtime.constrained.choose import BackendChooser, make_backend

        cfg, info = self.config, self.model_info
        chooser = BackendChooser(
            cfg.grammar_backend,
            lambda name: make_backend(
                name,
                self.tokenizer,
                int(info["vocab_size"]),
                list(info["eos_token_ids"]),
                cfg.json_schema_strict,
                index=False,
                cache_size=cfg.grammar_cache_size,
                compile_timeout=cfg.grammar_compile_timeout,
                enable_jump_forward=False,
                compile_workers=cfg.grammar_compile_workers,
                compile_memory_mb=cfg.grammar_compile_memory_mb,
            ),
        )
        chooser.for_kind(
            "regex"
        )  # the configured backend now (outlines walks the vocabulary: ~0.5 s)
        return chooser

    async def _validate_constraint(self, kind: str, spec: Any) -> None:
        """Schema normalisation can be slow or explosive: it runs in the grammar workers (killed at the
        compile timeout), awaited on a thread, so the event loop (/health, every stream) never waits."""
        if self._grammar is None:
            return
        try:
            await asyncio.to_thread(lambda: self._grammar.for_kind(kind).validate(kind, spec))
        except ValueError as e:
            raise APIError(f"invalid {kind}: {e}", param=kind) from None

    @property
    def limits(self) -> EdgeLimits:
        return EdgeLimits(int(self.model_info["vocab_size"]), self.context_len, self.pool_tokens)

    def make_requests(
        self,
        input_ids: list[int],
        sp: SamplingParams,
        *,
        stream: bool,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        program_id: str | None = None,
        pin_ttl_s: float | None = None,
        session_id: str | None = None,
    ) -> list[TokenizedGenerateReq]:
        """One prompt -> sp.n scheduler requests (seeds seed+i), after checking it can ever run."""
        try:
            start = check_prompt(
                input_ids,
                sp,
                self.limits,
                return_logprob=return_logprob,
                logprob_start_len=logprob_start_len,
                top_logprobs_num=top_logprobs_num,
            )
            return expand_n(
                self.new_rid(),
                input_ids,
                sp,
                stream=stream,
                return_logprob=return_logprob,
                logprob_start_len=start,
                top_logprobs_num=top_logprobs_num,
                program_id=program_id,
                pin_ttl_s=pin_ttl_s,
                session_id=session_id,
            )
        except RequestError as e:
            raise from_value_error(e) from None

    def generate(self, reqs: list[TokenizedGenerateReq]) -> RequestHandle:
        self.check_alive()
        if len(reqs) > self.config.max_prompts_per_request:
            raise APIError(
                f"the request asks for {len(reqs)} sequences (prompts x n); at most "
                f"{self.config.max_prompts_per_request} are allowed (max_prompts_per_request)",
                param="prompt",
            )
        limit = self.config.max_running_requests + self.config.max_waiting_requests
        if len(self.states) + len(reqs) > limit:
            raise APIError(
                f"too many requests in flight ({len(self.states)}); try again later",
                503,
                "server_overloaded",
            )
        # encode all first: a request that cannot be sent (it never should, after the edge's bounds)
        # is refused whole and leaves nothing registered behind
        try:
            frames = [messages.encode(r) for r in reqs]
        except (TypeError, ValueError, OverflowError) as e:
            raise APIError(f"the request cannot be sent to the scheduler: {e}", 400) from None
        queue: asyncio.Queue = asyncio.Queue()
        for i, r in enumerate(reqs):
            self.states[r.rid] = ReqState(rid=r.rid, index=i, queue=queue, stream=r.stream)
        for frame in frames:
            self._push.send(frame)
        self.metrics.inflight.set(len(self.states))
        return RequestHandle(self, reqs, queue)

    def abort(self, rid: str) -> None:
        if self.states.pop(rid, None) is not None and self.dead_reason is None:
            self._send(AbortReq(rid=rid))

    # ------------------------------------------------------------------ admin round trips
    async def _ask(self, msg: Any, answer: type, timeout: float) -> Any:
        self.check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._waiters[answer].append(
            fut
        )  # answers come back in order; a late answer still resolves its own future
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

    async def profile(self, req: ProfileReq, timeout: float = 60.0) -> ProfileOut:
        return await self._ask(req, ProfileOut, timeout)

    async def cache_tree(
        self, max_depth: int, max_nodes: int, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The scheduler's cache view with text previews (decoded here: the scheduler has no tokenizer)."""
        view = (
            await self._ask(
                GetCacheTreeReq(max_depth=max_depth, max_nodes=max_nodes), CacheTreeOut, timeout
            )
        ).view
        if "error" in view:
            raise APIError(f"the cache view failed: {view['error']}", 500, "server_error")
        return add_previews(view, self.tokenizer)

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
