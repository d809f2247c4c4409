"""One HTTP request's view of its sequences: the state the scheduler client keeps per sequence,
and the async iterator over their deltas that aborts whatever is unfinished when it is closed
(client gone, error, timeout)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from radixrt.runtime.messages import TokenizedGenerateReq


@dataclasses.dataclass
class ReqState:
    rid: str
    index: int  # position of this sequence in its HTTP request's outputs
    queue: asyncio.Queue
    stream: bool
    client: str | None = None  # whom it is counted against (serving/http/tenants.py)
    rows: int = 1  # the running rows it may hold: a beam search's beam_width, else 1
    created: float = dataclasses.field(default_factory=time.monotonic)
    last_token_time: float | None = None


class RequestHandle:
    """Async iterator of (index, output dict) for the sequences of one HTTP request."""

    def __init__(self, scheduler: Any, reqs: list[TokenizedGenerateReq], queue: asyncio.Queue):
        self.scheduler = scheduler  # the SchedulerClient (scheduler_client.py) that sent them
        self.reqs = reqs
        self.queue = queue
        self.unfinished = {r.rid for r in reqs}
        timeout = scheduler.config.request_timeout  # None or 0: no limit
        self.deadline = time.monotonic() + timeout if timeout else None

    def __aiter__(self) -> "RequestHandle":
        return self

    async def __anext__(self) -> tuple[int, dict[str, Any]]:
        if not self.unfinished:
            raise StopAsyncIteration
        try:
            if self.deadline is None:
                index, out = await self.queue.get()
            else:
                index, out = await asyncio.wait_for(
                    self.queue.get(), max(0.0, self.deadline - time.monotonic())
                )
        except asyncio.TimeoutError:
            rid = next(iter(sorted(self.unfinished)))
            self.scheduler.abort(rid)
            self.unfinished.discard(rid)
            index = [r.rid for r in self.reqs].index(rid)
            msg = f"request timed out after {self.scheduler.config.request_timeout} s"
            return index, {
                "rid": rid,
                "new_ids": [],
                "text": "",
                "finished_reason": {"type": "abort", "message": msg},
            }
        if out.get("finished_reason") is not None:
            self.unfinished.discard(out["rid"])
        return index, out

    def close(self) -> None:
        """Abort every unfinished sequence (pages go back at once). Never awaits: safe while
        cancelled."""
        for rid in self.unfinished:
            self.scheduler.abort(rid)
        self.unfinished.clear()
