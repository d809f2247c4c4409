"""The scheduler's beam searches: groups start at intake, advance once all their beams offered,
start again when preempted, and end with one TokenOut carrying the beams, or with an abort. The
search is beam_search.py's, the mapping of beams onto requests and pages beam_group.py's.

A collaborator of the Scheduler: the queues it moves beams in and out of are passed to each call.
A beam search's root keeps its own status while its search runs, whether or not it is still one of
the beams; the other beams run, and end when pruned or when the search ends.
"""

from __future__ import annotations

import logging

from radixrt.runtime.core.beam_group import BeamGroup
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.outbox import Outbox
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats

log = logging.getLogger(__name__)

BEAM_ENDED = FinishReason.abort("beam search ended")


class BeamSearches:
    def __init__(self, memory: ReqMemory, outbox: Outbox, stats: SchedulerStats, eos_ids: set[int]):
        self.memory = memory
        self.outbox = outbox
        self.stats = stats
        self.eos_ids = eos_ids
        self.groups: dict[str, BeamGroup] = {}  # by the root's rid

    def start(self, req: Req) -> None:
        """req asks for beam search: its group, keyed by its rid. EOS ends a beam unless
        ignore_eos; stop_token_ids always do."""
        sp = req.sampling
        stop_ids = set() if sp.ignore_eos else set(self.eos_ids)
        req.beam = BeamGroup(req, frozenset(stop_ids | set(sp.stop_token_ids)))
        self.groups[req.rid] = req.beam

    def advance(self, running: list[Req], waiting: list[Req]) -> None:
        """After a step's results: every group whose beams all offered takes its search step."""
        for group in [g for g in self.groups.values() if g.ready()]:
            try:
                moves = group.advance(self.memory)
            except Exception as e:  # the grammar, say: this request's failure alone
                log.exception("beam search step of %s failed", group.root.rid)
                error = f"internal error: {type(e).__name__}: {e}"
                self.end(group, running, waiting, FinishReason.abort(error), error, 500)
                continue
            for beam in moves.removed:
                running.remove(beam)
                if beam is not group.root:
                    beam.end(BEAM_ENDED)
            for beam in moves.added:
                beam.move_to(ReqStatus.RUNNING)
                running.append(beam)
            if moves.out_of_memory:
                self.restart(group, running, waiting)
            elif group.search.done:
                self.end(group, running, waiting)

    def restart(self, group: BeamGroup, running: list[Req], waiting: list[Req]) -> None:
        """Preemption of any beam takes the whole group: every beam's memory goes, and the root
        waits at the head of the queue to run the search again (deterministic: same result)."""
        log.debug("preempting beam search %s (%d beams)", group.root.rid, len(group.beams))
        self._drop_beams(group, running)
        group.restart()
        root = group.root
        root.num_preemptions += 1
        self.stats.num_preemptions += 1
        if root.status is ReqStatus.RUNNING:
            root.move_to(ReqStatus.WAITING)
        if root not in waiting:
            waiting.insert(0, root)

    def end(
        self,
        group: BeamGroup,
        running: list[Req],
        waiting: list[Req],
        reason: FinishReason | None = None,
        error: str | None = None,
        status: int = 400,
    ) -> None:
        """The search is over (reason None: its result goes out) or cut short (an abort, or a
        failure with its error and status: they go out on the root)."""
        root = group.root
        self._drop_beams(group, running)
        if root in waiting:
            waiting.remove(root)
        del self.groups[root.rid]
        if reason is None:
            out = group.result()
            root.output_ids = list(out.beams[0]["output_ids"]) if out.beams else []
            root.end(FinishReason.stop(None))
            self.outbox.put(out)
        else:
            root.output_ids, root.num_sent = [], 0
            root.end(reason)
            root.error, root.error_status = error, status
            self.outbox.emit(root)
        self.stats.on_finish(root)

    def _drop_beams(self, group: BeamGroup, running: list[Req]) -> None:
        """Every live beam's memory goes back and it stops running; each but the root ends, so what
        is left of a step's results passes over it."""
        for beam in group.beams:
            if beam.kv.table_row is not None:
                self.memory.drop(beam)
                running.remove(beam)
            if beam is not group.root:  # the root waits again (restart) or ends with its reason
                beam.end(BEAM_ENDED)
