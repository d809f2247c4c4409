"""A step that cannot go on as planned (a base of Scheduler): when its forward or sampling failed,
its culprits fail alone and the others run it again; when memory is short, the newest request is
preempted."""

from __future__ import annotations

import logging
from typing import Any

from radixrt.runtime.core.plan import PlanItem, PlanItemError
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats

log = logging.getLogger(__name__)


class StepRecovery:
    # the Scheduler's
    memory: ReqMemory
    stats: SchedulerStats
    _fail: Any
    check_integrity: Any

    def _recover(self, plan: list[tuple[Req, PlanItem]], error: Exception) -> None:
        """A forward or sampling failed: its culprits (the whole step if it cannot tell) fail; the
        others rerun it. Nothing was applied, so each request holds its KV, but its table row may or
        may not have been written: rewrite it in full. A broken invariant after this propagates."""
        culprits = set(error.indices) if isinstance(error, PlanItemError) else set(range(len(plan)))
        status = error.status if isinstance(error, PlanItemError) else 500
        if status >= 500:
            log.error(
                "step failed (%s: %s); failing %d of its %d requests",
                type(error).__name__,
                error,
                len(culprits),
                len(plan),
                exc_info=not isinstance(error, PlanItemError),
            )
            self.stats.num_step_failures += 1
        else:
            log.warning("%d request(s) cannot go on: %s", len(culprits), error)
        for i, (req, _) in enumerate(plan):
            req.table_stale = True
            req.draft_ids, req.draft_states = [], []
            if i in culprits and not req.finished:
                self._fail(
                    req,
                    str(error)
                    if status < 500
                    else f"internal error: {type(error).__name__}: {error}",
                    status,
                )
            elif req.table_row is not None:
                self.memory.trim(req)  # pages grown for a draft that will not run
        self.check_integrity()

    def _newest_running(self) -> Req:
        return max(self.running, key=lambda r: (r.arrival_time, -len(r.output_ids)))

    def _preempt(self, req: Req) -> None:
        """Give req's memory back (its KV goes into the tree, so resuming is mostly a cache hit)."""
        if req.beam is not None:
            self._restart_beam_group(req.beam)
            return
        log.debug("preempting %s", req)
        self._release(req)
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.insert(0, req)
