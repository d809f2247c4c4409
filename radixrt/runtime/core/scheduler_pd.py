"""SchedulerPD (a Scheduler base): the scheduler's side of prefill-decode disaggregation.

Prefill server: a request is admitted, computed and sampled as usual; after its first token it
stops running but keeps its pages (`sending`) until the KVLink reports them written into the decode
server's pages (or failed), then finishes: its KV stays in this server's radix tree.

Decode server: a request waits for pages like any other (its cached prefix matched in this server's
tree, the rest allocated), then, instead of an extend, registers those pages with the prefill
server (`receiving`). When they arrive it applies the prefill server's first token and decodes; its
prompt's pages go into this server's tree. It never computes a prompt token (unless preempted
later, when it resumes like any request). Pages of a request being written are freed only once the
link says no more bytes will land in them.
"""

from __future__ import annotations

import logging
from typing import Any

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.pd_link import Bootstrap, KVArrived, KVFailed, KVLink, KVSent
from radixrt.runtime.core.plan import ItemResult
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.req_finish import apply_sampled_token

log = logging.getLogger(__name__)

ADMIT_ALL = 1 << 40  # a decode server allocates a whole prompt at once: nothing is computed
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's, when a request names the host and room but no port


def bootstrap_of(msg: Any) -> Bootstrap | None:
    """The request's Bootstrap (a TokenizedGenerateReq's three fields), None when it has none."""
    if msg.bootstrap_room is None:
        return None
    host = msg.bootstrap_host or "127.0.0.1"
    return Bootstrap(host, msg.bootstrap_port or DEFAULT_BOOTSTRAP_PORT, msg.bootstrap_room)


class RoomInUse(ValueError):
    """A second request named a room in use: refused, and the first one's peer is not told."""


class SchedulerPD:
    kv_link: KVLink | None = None
    pd_mode = "null"

    def _init_pd(self, mode: str, kv_link: KVLink | None) -> None:
        if mode != "null" and kv_link is None:
            raise ValueError(f"--disaggregation-mode {mode} needs a KV link")
        self.pd_mode, self.kv_link = mode, kv_link
        self.sending: dict[int, Req] = {}  # prefill: computed, pages held until written
        self.receiving: dict[int, Req] = {}  # decode: pages registered, the KV not yet arrived

    def pd_held(self) -> list[Req]:
        """Requests that hold pages and a table row without running."""
        return [*self.sending.values(), *self.receiving.values()]

    def _check_room(self, req: Req) -> None:
        """A room names one request between two servers: a second one in use is refused."""
        if req.bootstrap is None:
            if self.pd_mode != "null":
                raise ValueError(
                    f"this is a {self.pd_mode} server: a request needs bootstrap_host and "
                    "bootstrap_room (sglang-router's PD mode adds them)"
                )
            return
        room = req.bootstrap.room
        if room in self.sending or room in self.receiving:
            raise RoomInUse(f"bootstrap_room {room} is already in use")
        queued = (*self.running, *self.waiting)
        if any(r.bootstrap is not None and r.bootstrap.room == room for r in queued):
            raise RoomInUse(f"bootstrap_room {room} is already in use")

    # ------------------------------------------------------------ prefill side
    def _hand_off(self, req: Req, reason: FinishReason | None, res: ItemResult) -> None:
        """The prompt is computed and its first token sampled: the pages wait for the transfer."""
        num_pages = -(-len(req.origin_input_ids) // self.page_size)
        first = {"id": res.next_id, "logprob": res.logprob, "top_logprobs": res.top_logprobs}
        # handed over before it leaves running: a send that raises fails it like any request
        self.kv_link.send(req.bootstrap.room, req.page_ids[:num_pages], first)
        self.running.remove(req)
        req.pd_reason = reason or FinishReason.length_limit(len(req.output_ids))
        self.sending[req.bootstrap.room] = req

    def _on_sent(self, ev: KVSent) -> None:
        req = self.sending.pop(ev.room, None)
        if req is None:
            return
        self.running.append(req)  # so _finish releases it as any running request
        if ev.error is not None:
            self.stats.kv_transfer_failures += 1
            self._fail(req, f"KV transfer to the decode server failed: {ev.error}", 500)
            return
        self.stats.on_transfer(ev.num_pages, ev.num_bytes, ev.seconds)
        self._finish(req, req.pd_reason)

    # ------------------------------------------------------------ decode side
    def _admit_waiting(self, budget: int, inflight: list[list[int]]) -> list:
        """Admission's extend items; on a decode server the requests whose KV is to come are
        admitted apart (_admit_receivers) and compute nothing."""
        if self.pd_mode != "decode":
            return self.admission.admit(
                self.waiting, self.running, budget, inflight, self.items.extend
            )
        self._admit_receivers()
        resumed = [r for r in self.waiting if r.bootstrap is None or r.output_ids]
        items = self.admission.admit(resumed, self.running, budget, inflight, self.items.extend)
        for req, _ in items:
            self.waiting.remove(req)
        return items

    def _admit_receivers(self) -> None:
        """Waiting requests whose KV is to come get their pages (admission's rules: fairness,
        decode reserve, rows) and register them with their prefill server."""
        ready = [r for r in self.waiting if r.bootstrap is not None and not r.output_ids]
        if not ready:
            return
        held = self.running + list(self.receiving.values())
        items = self.admission.admit(ready, held, ADMIT_ALL, [], lambda *a: None)
        for req, _ in items:
            self.waiting.remove(req)
            req.table_stale = True  # the first decode writes the whole row
            self.receiving[req.bootstrap.room] = req
            start = req.kv_len // self.page_size  # the cached prefix stays: only the rest travels
            self.kv_link.expect(req.bootstrap, req.page_ids[start:], start)

    def _on_arrived(self, ev: KVArrived) -> None:
        req = self.receiving.pop(ev.room, None)
        if req is None:
            return
        self.running.append(req)
        if req.pd_abort is not None:  # aborted while the bytes were on their way
            self._finish(req, req.pd_abort)
            return
        self.stats.on_transfer(ev.num_pages, ev.num_bytes, ev.seconds)
        self.memory.computed(req, len(req.origin_input_ids))
        self.memory.share(req)  # the received prompt pages join this server's tree
        first = ev.first
        top = [tuple(x) for x in first.get("top_logprobs") or []]
        res = ItemResult(next_id=int(first["id"]), logprob=first.get("logprob"), top_logprobs=top)
        self._after_tokens(req, apply_sampled_token(req, res, self.eos_ids))

    def _on_failed(self, ev: KVFailed) -> None:
        req = self.receiving.pop(ev.room, None)
        if req is None:
            return
        self.running.append(req)
        if req.pd_abort is not None:
            self._finish(req, req.pd_abort)
            return
        self.stats.kv_transfer_failures += 1
        self._fail(req, f"the KV cache did not arrive: {ev.error}", 500)

    # ------------------------------------------------------------ both
    def poll_transfers(self) -> bool:
        """Apply the link's events; True when there were any (their outputs wait in the outbox)."""
        if self.kv_link is None:
            return False
        events = self.kv_link.events()
        if not self.kv_link.alive:  # nothing more will come: what is held fails instead of hanging
            error = "the KV transfer agent stopped (see the server log)"
            events += [KVSent(room, error=error) for room in self.sending]
            events += [KVFailed(room, error) for room in self.receiving]
        for ev in events:
            try:
                if isinstance(ev, KVSent):
                    self._on_sent(ev)
                elif isinstance(ev, KVArrived):
                    self._on_arrived(ev)
                else:
                    self._on_failed(ev)
            except Exception:  # one request's bookkeeping must not stop the others'
                log.exception("applying the transfer event %s failed", ev)
        return bool(events)

    def _abort_held(self, rid: str) -> None:
        """An abort of a request whose pages are in flight: it ends once the link lets go."""
        for room, req in list(self.sending.items()):
            if req.rid == rid:
                self.kv_link.drop(room, "aborted on the prefill server")
        for req in self.receiving.values():
            if req.rid == rid and req.pd_abort is None:
                req.pd_abort = FinishReason.abort("aborted by the client")
                self.kv_link.cancel(req.bootstrap)

    def _pd_ended(self, req: Req, reason: FinishReason) -> None:
        """A disaggregated request ended before its KV moved: the peer stops waiting for it."""
        if req.bootstrap is None or req.pd_reason is not None or self.kv_link is None:
            return
        if self.pd_mode == "prefill":
            self.kv_link.drop(req.bootstrap.room, req.error or reason.message or "ended")
        elif self.pd_mode == "decode" and not req.output_ids:
            self.kv_link.cancel(req.bootstrap)

    def _refused_room(self, bootstrap: Bootstrap | None, error: Exception) -> None:
        """A request refused at intake: its peer learns now instead of at the timeout (unless the
        room is another request's)."""
        if bootstrap is None or self.kv_link is None or isinstance(error, RoomInUse):
            return
        error = str(error)
        if self.pd_mode == "prefill":
            self.kv_link.drop(bootstrap.room, error)
        elif self.pd_mode == "decode":
            self.kv_link.cancel(bootstrap)
