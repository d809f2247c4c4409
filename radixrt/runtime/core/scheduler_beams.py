"""The scheduler's beam search part (a base of Scheduler, as SchedulerAdmin is): groups start at
intake, advance once all their beams offered, start again when preempted, and end with one TokenOut
carrying the beams, or with an abort. The search is beam_search.py's, the mapping of beams onto
requests and pages beam_group.py's."""

from __future__ import annotations

import logging

from radixrt.runtime.core.beam_group import BeamGroup
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.outbox import Outbox
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_memory import ReqMemory
from radixrt.runtime.core.scheduler_stats import SchedulerStats

log = logging.getLogger(__name__)


class SchedulerBeams:
    # the Scheduler's, set in its __init__
    memory: ReqMemory
    outbox: Outbox
    stats: SchedulerStats
    running: list[Req]
    waiting: list[Req]
    eos_ids: set[int]
    beam_groups: dict[str, BeamGroup]  # by the root's rid

    def _start_beam_group(self, req: Req) -> None:
        """req asks for beam search: its group, keyed by its rid. EOS ends a beam unless
        ignore_eos; stop_token_ids always do."""
        sp = req.sampling
        stop_ids = set() if sp.ignore_eos else set(self.eos_ids)
        req.beam = BeamGroup(req, frozenset(stop_ids | set(sp.stop_token_ids)))
        self.beam_groups[req.rid] = req.beam

    def _advance_beams(self) -> None:
        """After a step's results: every group whose beams all offered takes its search step."""
        for group in [g for g in self.beam_groups.values() if g.ready()]:
            try:
                moves = group.advance(self.memory)
            except Exception as e:  # the grammar, say: this request's failure alone
                log.exception("beam search step of %s failed", group.root.rid)
                error = f"internal error: {type(e).__name__}: {e}"
                self._end_beam_group(group, FinishReason.abort(error), error, 500)
                continue
            for beam in moves.removed:
                self.running.remove(beam)
            self.running.extend(moves.added)
            if moves.out_of_memory:
                self._restart_beam_group(group)
            elif group.search.done:
                self._end_beam_group(group)

    def _restart_beam_group(self, group: BeamGroup) -> None:
        """Preemption of any beam takes the whole group: every beam's memory goes, and the root
        waits at the head of the queue to run the search again (deterministic: same result)."""
        log.debug("preempting beam search %s (%d beams)", group.root.rid, len(group.beams))
        self._drop_beams(group)
        group.restart()
        group.root.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.insert(0, group.root)

    def _end_beam_group(
        self,
        group: BeamGroup,
        reason: FinishReason | None = None,
        error: str | None = None,
        status: int = 400,
    ) -> None:
        """The search is over (reason None: its result goes out) or cut short (an abort, or a
        failure with its error and status: they go out on the root)."""
        root = group.root
        self._drop_beams(group)
        if root in self.waiting:
            self.waiting.remove(root)
        del self.beam_groups[root.rid]
        if reason is None:
            out = group.result()
            root.output_ids = list(out.beams[0]["output_ids"]) if out.beams else []
            root.finished_reason = FinishReason.stop(None)
            self.outbox.put(out)
        else:
            root.output_ids, root.num_sent = [], 0
            root.finished_reason = reason
            root.error, root.error_status = error, status
            self.outbox.emit(root)
        self.stats.on_finish(root)

    def _drop_beams(self, group: BeamGroup) -> None:
        """Every live beam's memory goes back and it stops running; each is marked finished, so
        what is left of a step's results passes over it."""
        for beam in group.beams:
            if beam.table_row is not None:
                self.memory.drop(beam)
                self.running.remove(beam)
            if beam is not group.root:  # the root waits again (restart) or ends with its reason
                beam.finished_reason = FinishReason.abort("beam search ended")
