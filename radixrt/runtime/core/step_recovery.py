"""A step whose forward or sampling failed: who fails with it, and what the others must redo.

Nothing of the step was applied, so each request holds its KV, but its table row may or may not
have been written: every request's row is marked stale (rewritten in full next step) and its draft
dropped. The culprits (the whole step when the error cannot tell) fail alone; the others run again.
"""

from __future__ import annotations

import logging

from radixrt.runtime.core.plan import PlanItemError
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats

log = logging.getLogger(__name__)


def recover(
    reqs: list[Req], error: Exception, memory: ReqMemory, stats: SchedulerStats
) -> list[tuple[Req, str, int]]:
    """Undo the step for reqs (the plan's requests, in plan order); returns the failures to apply:
    (request, error for its client, status)."""
    culprits = set(error.indices) if isinstance(error, PlanItemError) else set(range(len(reqs)))
    status = error.status if isinstance(error, PlanItemError) else 500
    if status >= 500:
        log.error(
            "step failed (%s: %s); failing %d of its %d requests",
            type(error).__name__,
            error,
            len(culprits),
            len(reqs),
            exc_info=not isinstance(error, PlanItemError),
        )
        stats.num_step_failures += 1
    else:
        log.warning("%d request(s) cannot go on: %s", len(culprits), error)
    message = str(error) if status < 500 else f"internal error: {type(error).__name__}: {error}"
    failures = []
    for i, req in enumerate(reqs):
        req.kv.table_stale = True
        req.draft_ids, req.draft_states = [], []
        if i in culprits and not req.finished:
            failures.append((req, message, status))
        elif req.kv.table_row is not None:
            memory.trim(req)  # pages grown for a draft that will not run
    return failures
