"""The scheduler process: a ZeroMQ loop around `Scheduler` (which knows nothing of sockets).

Loop: take every message waiting on the socket without blocking (requests, aborts, admin
queries), then run one `step()` if there is work, and push the token deltas to the
detokenizer. With nothing to do it blocks on the socket (poll timeout) instead of spinning.
Admin answers (flush, server info, health) go straight back to the main process's scheduler client
(scheduler_client.py); LoRA loads are read on a worker thread and answered when installed
(lora_loads.py).
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

import zmq

from radixrt.runtime import messages
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import (
    AbortReq,
    BatchTokenOut,
    CacheTreeOut,
    CloseSessionReq,
    DetokenizeReq,
    FlushCacheOut,
    FlushCacheReq,
    GetCacheTreeReq,
    GetServerInfoReq,
    HealthCheckOut,
    HealthCheckReq,
    LoraAdapterReq,
    MalformedRequest,
    ProcessFailed,
    ProcessReady,
    ProfileOut,
    ProfileReq,
    SchedulerInfo,
    TokenizedGenerateReq,
    TokenOut,
    UnpinReq,
)
from radixrt.runtime.processes import StopFlag, set_parent_death_signal
from radixrt.runtime.serving.backend.lora_loads import LoraLoads
from radixrt.runtime.serving.backend.step_profiler import StepProfiler

logger = logging.getLogger(__name__)

DEFAULT_SCHEDULER_CLASS = "radixrt.runtime.engine.scheduler_factory:create_scheduler"
IDLE_POLL_MS = 100  # how long an idle loop sleeps on the socket before checking its parent again
LORA_POLL_MS = 5  # ... while a LoRA adapter is being read: its answer waits on the next poll


def load_class(path: str) -> type:
    """ "module:name" -> a class or factory taking the config (tests substitute a fake scheduler
    this way)."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"scheduler class must look like 'package.module:Class', got {path!r}")
    return getattr(importlib.import_module(module), name)


class SchedulerLoop:
    def __init__(
        self, scheduler: Any, pull: zmq.Socket, to_detokenizer: zmq.Socket, to_tokenizer: zmq.Socket
    ):
        self.scheduler = scheduler
        self.pull = pull
        self.to_detokenizer = to_detokenizer
        self.to_tokenizer = to_tokenizer
        self.profiler = StepProfiler(scheduler.config)
        self.loras = LoraLoads(scheduler, lambda out: to_tokenizer.send(messages.encode(out)))
        self.poller = zmq.Poller()
        self.poller.register(pull, zmq.POLLIN)
        # a disaggregated server's KV transfer events wake the loop too (disaggregation/transfer.py)
        self.kv_events = getattr(getattr(scheduler, "kv_transfer", None), "event_socket", None)
        if self.kv_events is not None:
            self.poller.register(self.kv_events, zmq.POLLIN)

    def send_outputs(self, outs: list[TokenOut]) -> None:
        if outs:
            batch = BatchTokenOut(outputs=outs)
            self.to_detokenizer.send(messages.encode(batch))

    def handle(self, msg: Any) -> None:
        s = self.scheduler
        if isinstance(msg, TokenizedGenerateReq):
            # Registered on the same socket as the outputs, so it always reaches the detokenizer
            # first.
            text_keys = (
                "stop",
                "stop_regex",
                "skip_special_tokens",
                "spaces_between_special_tokens",
                "no_stop_trim",
            )
            self.to_detokenizer.send(
                messages.encode(
                    DetokenizeReq(
                        rid=msg.rid,
                        sampling_params={
                            k: msg.sampling_params[k] for k in text_keys if k in msg.sampling_params
                        },
                    )
                )
            )
            s.add_request(msg)
            self.send_outputs(s.take_outputs())  # a refusal goes out at once
        elif isinstance(msg, AbortReq):
            s.abort(msg.rid)
            self.send_outputs(s.take_outputs())
        elif isinstance(msg, HealthCheckReq):
            self.to_tokenizer.send(messages.encode(HealthCheckOut(probe_id=msg.probe_id)))
        elif isinstance(msg, GetServerInfoReq):
            # the integrity walk only when idle: a scrape (/metrics, /get_server_info) never costs a
            # step
            info = s.admin.server_info(walk=not s.has_work())
            self.to_tokenizer.send(messages.encode(SchedulerInfo(info=info)))
        elif isinstance(msg, GetCacheTreeReq):
            self.to_tokenizer.send(
                messages.encode(CacheTreeOut(view=s.admin.cache_tree(msg.max_depth, msg.max_nodes)))
            )
        elif isinstance(msg, UnpinReq):
            s.admin.unpin(msg.handle)
        elif isinstance(msg, CloseSessionReq):
            s.admin.close_session(msg.session_id, msg.cache_salt)
        elif isinstance(msg, FlushCacheReq):
            self.to_tokenizer.send(
                messages.encode(FlushCacheOut(success=bool(s.admin.flush_cache())))
            )
        elif isinstance(msg, LoraAdapterReq):
            self.loras.submit(msg)  # answered in order, once installed (never raises)
        elif isinstance(msg, ProfileReq):
            if msg.action == "start":
                ok, text = self.profiler.start(msg.output_dir, msg.num_steps)
            else:
                ok, text = self.profiler.stop()
            self.to_tokenizer.send(messages.encode(ProfileOut(success=ok, message=text)))
        else:
            logger.warning("unexpected message %s", type(msg).__name__)

    def drain(self, timeout_ms: int) -> None:
        """Handle every waiting message; wait up to timeout_ms for the first one."""
        if timeout_ms and not self.poller.poll(timeout_ms):
            return
        while True:
            try:
                data = self.pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = None
            try:
                msg = messages.decode(data)
                self.handle(msg)
            except MalformedRequest as e:  # its sender waits for an answer: a 400 naming the field
                self.scheduler.refuse(e.rid, e)
                self.send_outputs(self.scheduler.take_outputs())
            except Exception as e:  # one bad message (or a bug handling it) must not end the loop
                logger.exception("handling a message failed; the loop goes on")
                # admin callers are answered in order: a missing answer would shift every later one
                if isinstance(msg, GetServerInfoReq):
                    self.to_tokenizer.send(
                        messages.encode(SchedulerInfo(info={"error": f"{type(e).__name__}: {e}"}))
                    )
                elif isinstance(msg, FlushCacheReq):
                    self.to_tokenizer.send(messages.encode(FlushCacheOut(success=False)))
                elif isinstance(msg, GetCacheTreeReq):
                    self.to_tokenizer.send(
                        messages.encode(CacheTreeOut(view={"error": f"{type(e).__name__}: {e}"}))
                    )
                elif isinstance(msg, ProfileReq):
                    self.to_tokenizer.send(
                        messages.encode(
                            ProfileOut(success=False, message=f"{type(e).__name__}: {e}")
                        )
                    )

    def run(self, flag: StopFlag) -> None:
        s = self.scheduler
        idle_steps = 0
        while not flag.should_stop():
            self.loras.poll()
            if self.kv_events is not None and s.poll_transfers():
                self.send_outputs(s.take_outputs())
            if not s.has_work():
                self.drain(LORA_POLL_MS if self.loras.busy else IDLE_POLL_MS)
                continue
            # Requests whose grammar is still compiling are work without a forward: back off a
            # little.
            self.drain(1 if idle_steps else 0)
            ran = s.step()
            outs = s.take_outputs()
            self.send_outputs(outs)
            if ran:
                self.profiler.after_step()
            idle_steps = 0 if (ran or outs) else idle_steps + 1


def run_scheduler_process(
    config_dict: dict[str, Any],
    in_path: str,
    detokenizer_path: str,
    tokenizer_path: str,
    scheduler_class: str = DEFAULT_SCHEDULER_CLASS,
) -> None:
    """Entry point of the scheduler process (spawned): load the model, report ready, loop."""
    set_parent_death_signal()
    _thread_lock_for_progress_bars()
    flag = StopFlag()
    config = ServerConfig(**config_dict)
    logging.basicConfig(
        level=config.log_level.upper(), format="[scheduler] %(levelname)s %(message)s"
    )
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(in_path)
    to_detokenizer = ctx.socket(zmq.PUSH)
    to_detokenizer.connect(detokenizer_path)
    to_tokenizer = ctx.socket(zmq.PUSH)
    to_tokenizer.connect(tokenizer_path)
    try:
        started = time.perf_counter()
        try:
            scheduler = load_class(scheduler_class)(config)
        except Exception as e:
            logger.exception("scheduler failed to start")
            to_tokenizer.send(
                messages.encode(ProcessFailed(name="scheduler", error=f"{type(e).__name__}: {e}"))
            )
            raise SystemExit(1) from None
        logger.info("model loaded in %.1f s", time.perf_counter() - started)
        runner = getattr(scheduler, "runner", None)  # a test's fake scheduler has none
        # a lost tensor parallel rank ends this process; the watchdog reports
        if runner is not None:
            runner.exit_on_rank_loss = True
        info = {"model_info": scheduler.model_info, "server_info": scheduler.admin.server_info()}
        to_tokenizer.send(messages.encode(ProcessReady(name="scheduler", info=info)))
        flag.enter_loop()
        loop = SchedulerLoop(scheduler, pull, to_detokenizer, to_tokenizer)
        try:
            loop.run(flag)
        finally:
            loop.loras.close()
            scheduler.close()
    finally:
        for sock in (pull, to_detokenizer, to_tokenizer):
            sock.close(linger=0 if sock is pull else 500)
        ctx.term()
    logger.info("stopped")
    flag.exit_now()


def _thread_lock_for_progress_bars() -> None:
    """Inductor's compile progress bar (tqdm) would create a multiprocessing lock, a named semaphore
    this process never releases, so every stop ended with a "leaked semaphore" warning: in this
    process (it starts no others through tqdm) a thread lock does the same job."""
    import threading

    from tqdm import tqdm

    if getattr(tqdm, "_lock", None) is None:
        tqdm.set_lock(threading.RLock())
