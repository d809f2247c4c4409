"""The two KV roles of prefill-decode disaggregation (kv_roles.py: the hooks, the unified role).

Prefill server: a request is admitted, computed and sampled as usual; after its first token the role
takes it (on_sampled): it stops running but keeps its pages (SENDING) until the KVTransfer reports
them written into the decode server's pages (or failed); poll then hands it back to finish. Its KV
stays in this server's radix tree.

Decode server: a request waits for pages like any other (its cached prefix matched in this server's
tree, the rest allocated), then, instead of an extend, the role registers those pages with the
prefill server (WAITING_FOR_KV). When they arrive, poll hands it back with the prefill server's
first token and it decodes; its prompt's pages go into this server's tree. It never computes a
prompt token (unless preempted later, when it resumes like any request). Pages of a request being
written are freed only once the transfer says no more bytes will land in them.
"""

from __future__ import annotations

import logging

from radixrt.runtime.core.admission import Admission, ExtendItem
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.kv_roles import TransferDone, UnifiedRole
from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent, KVTransfer
from radixrt.runtime.core.plan import ItemResult, PlanItem
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.scheduler_stats import SchedulerStats
from radixrt.runtime.request.option_checks import missing_bootstrap
from radixrt.runtime.request.options import Bootstrap

log = logging.getLogger(__name__)

ADMIT_ALL = 1 << 40  # a decode server allocates a whole prompt at once: nothing is computed


class RoomInUse(ValueError):
    """A second request named a room in use: refused, and the first one's peer is not told."""


class _PDRole(UnifiedRole):
    """What both halves share: the room check, the held requests, the transfer's liveness."""

    rows_all_running = False  # requests sending or awaiting their KV hold rows too

    def __init__(self, transfer: KVTransfer, page_size: int, stats: SchedulerStats):
        self.transfer = transfer
        self.page_size = page_size
        self.stats = stats
        self.by_room: dict[int, Req] = {}  # requests whose KV is in flight, by bootstrap room

    def intake(self, req: Req, running: list[Req], waiting: list[Req]) -> None:
        """A room names one request between two servers: a second one in use is refused."""
        boot = req.options.bootstrap
        if boot is None:  # (intake's check_request refused it already: the edge's rule)
            raise missing_bootstrap(self.name, "bootstrap_room")
        if boot.room in self.by_room or any(
            r.options.bootstrap is not None and r.options.bootstrap.room == boot.room
            for r in (*running, *waiting)
        ):
            raise RoomInUse(f"bootstrap_room {boot.room} is already in use")

    def held(self) -> list[Req]:
        return list(self.by_room.values())

    def poll(self) -> list[TransferDone]:
        events = self.transfer.events()
        if not self.transfer.alive:  # nothing more will come: what is held fails, never hangs
            events += self.dead_events("the KV transfer agent stopped (see the server log)")
        done = []
        for ev in events:
            try:
                req = self.by_room.pop(ev.room, None)
                if req is not None:
                    done.append(self.on_event(req, ev))
            except Exception:  # one request's bookkeeping must not stop the others'
                log.exception("applying the transfer event %s failed", ev)
        return done

    def close(self) -> None:
        self.transfer.close()


class PrefillRole(_PDRole):
    name = "prefill"

    def __init__(self, transfer: KVTransfer, page_size: int, stats: SchedulerStats):
        super().__init__(transfer, page_size, stats)
        self.ends: dict[int, FinishReason] = {}  # how a handed-off request ends, by room

    def refused(self, bootstrap: Bootstrap | None, error: Exception) -> None:
        if bootstrap is not None and not isinstance(error, RoomInUse):
            self.transfer.drop(bootstrap.room, str(error))

    def on_sampled(self, req: Req, reason: FinishReason | None, res: ItemResult) -> bool:
        """The prompt is computed and its first token sampled: the pages wait for the transfer."""
        boot = req.options.bootstrap
        num_pages = -(-len(req.origin_input_ids) // self.page_size)
        first = {"id": res.next_id, "logprob": res.logprob, "top_logprobs": res.top_logprobs}
        # a send that raises fails the request like any other (it still runs)
        self.transfer.send(boot.room, req.kv.page_ids[:num_pages], first)
        self.ends[boot.room] = reason or FinishReason.length_limit(len(req.output_ids))
        self.by_room[boot.room] = req
        return True

    def on_event(self, req: Req, ev: KVSent) -> TransferDone:
        end = self.ends[ev.room]  # popped by on_finish, which this TransferDone leads to
        if ev.error is not None:
            self.stats.kv_transfer_failures += 1
            return TransferDone(req, error=f"KV transfer to the decode server failed: {ev.error}")
        self.stats.on_transfer(ev.num_pages, ev.num_bytes, ev.seconds)
        return TransferDone(req, reason=end)

    def dead_events(self, error: str) -> list[KVSent]:
        return [KVSent(room, error=error) for room in self.by_room]

    def abort(self, rid: str) -> None:
        for room, req in list(self.by_room.items()):
            if req.rid == rid:
                self.transfer.drop(room, "aborted on the prefill server")

    def on_finish(self, req: Req, reason: FinishReason) -> None:
        """Ended before its KV was handed to the transfer: the decode server stops waiting (after a
        hand-off the transfer told it already)."""
        boot = req.options.bootstrap
        if boot is not None and self.ends.pop(boot.room, None) is None:
            self.transfer.drop(boot.room, req.error or reason.message or "ended")


class DecodeRole(_PDRole):
    name = "decode"
    computes_prompts = False  # a decode server computes no prompt to fork from

    def __init__(self, transfer: KVTransfer, page_size: int, stats: SchedulerStats):
        super().__init__(transfer, page_size, stats)
        self.aborted: dict[int, FinishReason] = {}  # rooms aborted while in flight

    def refused(self, bootstrap: Bootstrap | None, error: Exception) -> None:
        if bootstrap is not None and not isinstance(error, RoomInUse):
            self.transfer.cancel(bootstrap)

    def admit(
        self,
        waiting: list[Req],
        running: list[Req],
        budget: int,
        inflight: list[list[int]],
        admission: Admission,
        extend_item: ExtendItem,
    ) -> list[tuple[Req, PlanItem]]:
        """Requests whose KV is to come get their pages (admission's rules: fairness, decode
        reserve, rows) and register them with their prefill server; the others (preempted ones
        resuming) are admitted as usual."""
        receivers = [r for r in waiting if r.options.bootstrap is not None and not r.output_ids]
        if receivers:
            held = running + self.held()
            taken = admission.admit(
                receivers, held, ADMIT_ALL, [], lambda *a: None, ReqStatus.WAITING_FOR_KV
            )
            for req, _ in taken:
                waiting.remove(req)
                self.expect(req)
        resumed = [r for r in waiting if r.options.bootstrap is None or r.output_ids]
        items = admission.admit(resumed, running, budget, inflight, extend_item)
        for req, _ in items:
            waiting.remove(req)
        return items

    def expect(self, req: Req) -> None:
        boot = req.options.bootstrap
        req.kv.table_stale = True  # the first decode writes the whole row
        self.by_room[boot.room] = req
        start = req.kv.computed_len // self.page_size  # the cached prefix stays: the rest travels
        self.transfer.expect(boot, req.kv.page_ids[start:], start)

    def on_event(self, req: Req, ev: KVArrived | KVFailed) -> TransferDone:
        aborted = self.aborted.pop(ev.room, None)
        if aborted is not None:  # aborted while the bytes were on their way
            return TransferDone(req, reason=aborted)
        if isinstance(ev, KVFailed):
            self.stats.kv_transfer_failures += 1
            return TransferDone(req, error=f"the KV cache did not arrive: {ev.error}")
        self.stats.on_transfer(ev.num_pages, ev.num_bytes, ev.seconds)
        first = ev.first
        top = [tuple(x) for x in first.get("top_logprobs") or []]
        res = ItemResult(next_id=int(first["id"]), logprob=first.get("logprob"), top_logprobs=top)
        return TransferDone(req, first=res)

    def dead_events(self, error: str) -> list[KVFailed]:
        return [KVFailed(room, error) for room in self.by_room]

    def abort(self, rid: str) -> None:
        for room, req in self.by_room.items():
            if req.rid == rid and room not in self.aborted:
                self.aborted[room] = FinishReason.abort("aborted by the client")
                self.transfer.cancel(req.options.bootstrap)

    def on_finish(self, req: Req, reason: FinishReason) -> None:
        """Ended before its KV arrived (refused, say, after intake): the prefill server stops."""
        if req.options.bootstrap is not None and not req.output_ids:
            self.transfer.cancel(req.options.bootstrap)


def make_role(
    mode: str, transfer: KVTransfer | None, page_size: int, stats: SchedulerStats
) -> UnifiedRole:
    """The role of --disaggregation-mode (null, prefill, decode)."""
    if mode == "null":
        return UnifiedRole()
    if transfer is None:
        raise ValueError(f"--disaggregation-mode {mode} needs a KV transfer")
    role = {"prefill": PrefillRole, "decode": DecodeRole}[mode]
    return role(transfer, page_size, stats)
