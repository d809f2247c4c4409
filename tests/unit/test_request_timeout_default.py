"""A request that sets no timeout of its own is aborted once the default request_timeout (600 s)
has passed, on a server started with no --request-timeout. The timeout is applied where the HTTP
side waits on the request's outputs (serving/http/request_handle.py); here its clock and the event loop's
are one virtual clock that jumps to the next timer instead of sleeping, so 600 s pass at once.

Truth: the configuration `radixrt serve` builds from no flags, the request sent to the scheduler
through TokenizerManager.generate, the AbortReq the scheduler receives, the output the HTTP side
gets and the virtual time at which it gets it (not before 600 s, and not much after)."""

from __future__ import annotations

import asyncio
import selectors
import types

from radixrt.cli import build_parser
from radixrt.runtime import messages
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import AbortReq, TokenizedGenerateReq
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.serving.http import request_handle
from radixrt.runtime.serving.http.scheduler_client import SchedulerClient
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

DEFAULT_TIMEOUT_S = 600


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _JumpingSelector(selectors.DefaultSelector):
    """With nothing ready, jumps the clock by the loop's wait for its next timer."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer at all: it would wait forever
            raise AssertionError("the loop waits forever: nothing will time the request out")
        self.clock.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: Clock) -> None:
        super().__init__(_JumpingSelector(clock))
        self.clock = clock

    def time(self) -> float:
        return self.clock.now


class FakePush:
    """The scheduler's end of the PUSH socket: what was sent to it."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, frame: bytes) -> None:
        self.sent.append(messages.decode(frame))


def test_a_request_with_no_timeout_of_its_own_is_aborted_after_the_default(monkeypatch):
    config = ServerConfig.from_cli_args(build_parser().parse_args(["serve"]))  # no flags
    clock = Clock()
    monkeypatch.setattr(request_handle, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    scheduler = SchedulerClient(config, "ipc://unused-scheduler", "ipc://unused-tokenizer")
    push = FakePush()
    scheduler._push = push
    manager = object.__new__(TokenizerManager)  # its generate() needs no tokenizer
    manager.config, manager.scheduler = config, scheduler
    req = TokenizedGenerateReq(
        rid="r-1", input_ids=[1, 2, 3], sampling_params=SamplingParams().to_dict()
    )

    async def main():
        submitted = clock.now
        handle = manager.generate([req])
        assert [type(m) for m in push.sent] == [TokenizedGenerateReq]  # sent, never answered
        # only keeps a request that is never timed out from waiting forever
        ceiling = 10 * DEFAULT_TIMEOUT_S
        try:
            index, out = await asyncio.wait_for(handle.__anext__(), ceiling)
        except TimeoutError:
            raise AssertionError(f"the request was not timed out within {ceiling} s") from None
        return index, out, clock.now - submitted, handle

    loop = VirtualTimeLoop(clock)
    try:
        index, out, waited, handle = loop.run_until_complete(main())
    finally:
        loop.close()
    assert index == 0 and out["rid"] == "r-1", out
    assert out["finished_reason"]["type"] == "abort", out
    assert "timed out" in out["finished_reason"]["message"], out
    assert DEFAULT_TIMEOUT_S <= waited < DEFAULT_TIMEOUT_S + 1, waited
    assert push.sent[1:] == [AbortReq(rid="r-1")]  # the scheduler is told to stop it
    assert "r-1" not in scheduler.states and not handle.unfinished
