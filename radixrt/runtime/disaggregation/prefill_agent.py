"""The prefill server's transfer agent: its bootstrap port (a ZeroMQ ROUTER on
--disaggregation-bootstrap-port, bound to --host, CURVE-authenticated: channel.py) takes the decode
servers' registrations; once the scheduler has computed a room's prompt (send) and its decode server
has registered pages for it, the agent sends the pages' bytes in chunks of whole pages (`pages`)
and then `done` with the first token.

The bytes queued for one decode server are bounded: at most PEER_QUEUE_MESSAGES chunks wait in
its queue (SNDHWM, sends that never block); a transfer whose next chunk does not fit waits, its
pages held, and goes on as the decode server reads (retried every RETRY_MS), or fails at the
timeout. A decode server that registers rooms and never reads holds a few chunks here, not every
room's KV (#56.3).

A room is registered once: a second registration for a room already registered or sent is refused
(the first stands). Either half may come first; each waits at most --disaggregation-transfer-timeout
for the other. A room dropped here (aborted, refused) or cancelled there is remembered for as long,
so the late half is answered at once instead of waiting out the timeout.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import zmq

from radixrt.runtime.disaggregation import wire
from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.channel import bootstrap_socket, close_bootstrap
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.peer_checks import PeerError, check_room

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20  # the pages travel in messages of about this size (whole pages each)
# rooms registered and rooms remembered as ended: a decode server (even an authenticated one) names
# them, so neither table may grow without bound; the oldest ended room is forgotten first
MAX_ROOMS = 1 << 16
PEER_QUEUE_MESSAGES = 4  # chunks queued to one decode server at most (its socket's SNDHWM)
# replies (a few hundred bytes each) that wait for a decode server whose queue is full, and how many
# decode servers may have some waiting
MAX_WAITING_REPLIES = 1024
MAX_WAITING_PEERS = 256
RETRY_MS = 5  # how soon a transfer waiting for a decode server to read tries again


def chunk_pages(bytes_per_page: int) -> int:
    """Pages per `pages` message: CHUNK_BYTES of them, at least one."""
    return max(1, CHUNK_BYTES // max(1, bytes_per_page))


class PrefillAgent(Agent):
    commands = wire.PREFILL_COMMANDS

    def __init__(
        self,
        ctx,
        cmd_addr,
        evt_addr,
        timeout_s,
        layout: KVLayout,
        pages: PageBytes,
        secret: str,
        bind: str,
    ):
        """pages: the pool's bytes; secret: --disaggregation-channel-secret; bind: the bootstrap
        endpoint (tcp://host:port), bound now so a taken port fails the server's start with its
        name."""
        super().__init__(ctx, cmd_addr, evt_addr, timeout_s)
        self.layout, self.pages = layout, pages
        self.net, self.router, self.auth = bootstrap_socket(secret, bind, PEER_QUEUE_MESSAGES)
        # a send to a decode server that is gone raises (instead of vanishing), and one to a
        # decode server whose queue is full raises zmq.Again (sends never block): nothing is dropped
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.poller.register(self.router, zmq.POLLIN)
        self.sends: dict[int, tuple[wire.SendCommand, float]] = {}  # room -> the command, since
        self.regs: dict[int, dict[str, Any]] = {}  # room -> the decode side's registration
        self.ended: dict[int, tuple[str, float]] = {}  # room -> why it will not be sent, since
        # room -> a transfer under way: its decode server, pages, the next page, the chunk that did
        # not fit yet, bytes queued, when it started
        self.outgoing: dict[int, dict[str, Any]] = {}
        self.replies: dict[bytes, deque[bytes]] = {}  # a decode server -> replies waiting for it

    def on_command(self, cmd: wire.Command) -> None:
        if isinstance(cmd, wire.SendCommand):
            if cmd.room in self.ended:
                self.emit(wire.SentEvent(room=cmd.room, error=self.ended[cmd.room][0]))
                return
            self.sends[cmd.room] = (cmd, time.monotonic())
            self._try_transfer(cmd.room)
        elif isinstance(cmd, wire.DropCommand):
            self._end(cmd.room, cmd.error)
            self._stop_sending(cmd.room, cmd.error)

    def _remember_ended(self, room: int, error: str) -> None:
        self.ended.pop(room, None)
        self.ended[room] = (error, time.monotonic())  # newest last
        if len(self.ended) > MAX_ROOMS:
            del self.ended[next(iter(self.ended))]

    def _end(self, room: int, error: str) -> None:
        """The room will not be sent: its registered decode side is told now, a later one then."""
        self._remember_ended(room, error)
        reg = self.regs.pop(room, None)
        if reg is not None:
            self._tell(reg["ident"], wire.Failed(room=room, error=error))

    def _stop_sending(self, room: int, error: str) -> None:
        """The room waits for its decode server, or is being sent: it stops (no page of it is read
        again), and the scheduler learns, so its pages may be freed."""
        if self.sends.pop(room, None) is not None:
            self.emit(wire.SentEvent(room=room, error=error))
        elif (t := self.outgoing.pop(room, None)) is not None:
            self._tell(t["ident"], wire.Failed(room=room, error=error))
            self.emit(wire.SentEvent(room=room, error=error))

    def _tell(self, ident: list[bytes], reply: wire.PeerMessage) -> None:
        """A message to one decode server, in order. One whose queue is full waits here (at most
        MAX_WAITING_REPLIES, the oldest dropped first, for at most MAX_WAITING_PEERS servers);
        one to a decode server that is gone is dropped (it learns by its timeout)."""
        msg = wire.encode(reply)
        waiting = self.replies.get(ident[0])
        if waiting is None:
            try:
                self.router.send_multipart([*ident, msg], flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if len(self.replies) >= MAX_WAITING_PEERS:
                    return
                waiting = self.replies[ident[0]] = deque(maxlen=MAX_WAITING_REPLIES)
            except zmq.ZMQError:
                return
        waiting.append(msg)

    def _send_waiting_replies(self) -> None:
        for key, waiting in list(self.replies.items()):
            try:
                while waiting:
                    self.router.send_multipart([key, waiting[0]], flags=zmq.NOBLOCK)
                    waiting.popleft()
            except zmq.Again:
                continue
            except zmq.ZMQError:  # gone
                pass
            del self.replies[key]

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            log.warning("a bootstrap message of %d frames ignored", len(frames))
            return
        ident = [frames[0].bytes]
        try:
            try:
                msg = wire.FROM_DECODE.decode(frames[1].buffer)
            except wire.BadMessage as e:
                if e.kind is not wire.Register or e.room is None:
                    raise
                msg = e  # a registration with a wrong field is answered, refused (its room read)
            if isinstance(msg, wire.Ping):
                self._tell(ident, wire.Pong())
                return
            room = check_room(msg.room)
        except PeerError as e:
            log.warning("a decode server's message ignored: %s", e)
            return
        if isinstance(msg, (wire.Register, wire.BadMessage)):
            self._register(ident, room, msg)
        elif isinstance(msg, wire.Cancel):
            self._cancel(ident, room)

    def _cancel(self, ident: list[bytes], room: int) -> None:
        reg = self.regs.get(room)
        if reg is not None and reg["ident"] != ident:
            return  # only the decode server that registered a room may cancel it
        t = self.outgoing.get(room)
        if reg is None and t is not None and t["ident"] != ident:
            return  # nor a room under way to another
        self.regs.pop(room, None)
        self._remember_ended(room, "cancelled by the decode server")
        self._stop_sending(room, "cancelled by the decode server")
        self._tell(ident, wire.Cancelled(room=room))

    def _register(
        self, ident: list[bytes], room: int, msg: wire.Register | wire.BadMessage
    ) -> None:
        """msg: the registration, or why it did not decode (then refused, once the room is known
        to be free: a malformed second registration does not end the first)."""
        if room in self.ended:
            self._tell(ident, wire.Failed(room=room, error=self.ended[room][0]))
            return
        if room in self.regs:  # the first registration stands; the second learns why not
            self._tell(ident, wire.Failed(room=room, error=f"room {room} is already registered"))
            return
        if len(self.regs) >= MAX_ROOMS:
            self._tell(ident, wire.Failed(room=room, error=f"{MAX_ROOMS} rooms already registered"))
            return
        why = str(msg) if isinstance(msg, wire.BadMessage) else self._layout_differs(msg.layout)
        if why is not None:
            error = f"registration refused: {why}"
            self._remember_ended(room, error)  # the room's send fails with it, now or when it comes
            if self.sends.pop(room, None) is not None:
                self.emit(wire.SentEvent(room=room, error=error))
            self._tell(ident, wire.Failed(room=room, error=error))
            return
        pages = {"num_pages": msg.num_pages, "start": msg.start}
        self.regs[room] = {"ident": ident, **pages, "since": time.monotonic()}
        self._try_transfer(room)

    def _layout_differs(self, layout: KVLayout) -> str | None:
        """Why the decode server's pages cannot take this pool's, or None. The layout is compared
        now and not kept: a registration holds a few ints, however large the layout it sent
        (#56.3: 65,536 rooms of 4,096-int layouts were ~10 GB)."""
        try:
            self.layout.check_same(layout)
        except ValueError as e:
            return str(e)
        return None

    def _try_transfer(self, room: int) -> None:
        """Both halves are here: start sending the pages, then `done`."""
        if room not in self.sends or room not in self.regs:
            return
        (send, _), reg = self.sends.pop(room), self.regs.pop(room)
        # a room is sent once: a later registration of it is refused
        self._remember_ended(room, f"room {room} was already sent")
        pages = send.pages[reg["start"] :]
        if len(pages) != reg["num_pages"]:
            error = f"{reg['num_pages']} pages asked for, {len(pages)} to send"
            self._tell(reg["ident"], wire.Failed(room=room, error=error))
            self.emit(wire.SentEvent(room=room, error=error))
            return
        self.outgoing[room] = {
            "ident": reg["ident"],
            "pages": pages,
            "first": send.first,
            "next": 0,
            "waiting": None,
            "bytes": 0,
            "started": time.perf_counter(),
            "since": time.monotonic(),
        }
        self._advance(room)

    def _advance(self, room: int) -> None:
        """Queue the room's next chunks, then `done`, while its decode server's queue has room;
        when all are queued, tell the scheduler (its pages may then be reused: each chunk is a
        copy)."""
        t = self.outgoing[room]
        step = chunk_pages(self.layout.bytes_per_page)
        try:
            while t["waiting"] is not None or t["next"] < len(t["pages"]):
                if t["waiting"] is None:
                    chunk = t["pages"][t["next"] : t["next"] + step]
                    head = wire.encode(wire.Pages(room=room, count=len(chunk)))
                    t["waiting"] = (head, self.pages.gather(chunk), len(chunk))
                head, buf, count = t["waiting"]
                frames = [*t["ident"], head, memoryview(buf.numpy())]
                self.router.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                t["waiting"], t["next"], t["bytes"] = (
                    None,
                    t["next"] + count,
                    t["bytes"] + buf.numel(),
                )
            done = wire.Done(
                room=room, first=t["first"], num_pages=len(t["pages"]), num_bytes=t["bytes"]
            )
            self.reply(self.router, t["ident"], done, zmq.NOBLOCK)
        except zmq.Again:
            return  # its queue is full: on when it has read (tick), or at the timeout
        except (ValueError, zmq.ZMQError) as e:
            del self.outgoing[room]
            error = str(e) or type(e).__name__
            self._tell(t["ident"], wire.Failed(room=room, error=error))
            self.emit(wire.SentEvent(room=room, error=error))
            return
        del self.outgoing[room]
        # gathered and queued; the decode side times arrival
        seconds = time.perf_counter() - t["started"]
        sent = {"num_pages": len(t["pages"]), "num_bytes": t["bytes"], "seconds": seconds}
        self.emit(wire.SentEvent(room=room, error=None, **sent))

    def poll_ms(self) -> int:
        return RETRY_MS if self.outgoing or self.replies else super().poll_ms()

    def tick(self, now: float) -> None:
        limit = self.timeout_s
        self._send_waiting_replies()
        for room in list(self.outgoing):
            if now - self.outgoing[room]["since"] > limit:
                t = self.outgoing.pop(room)
                error = f"the decode server did not read the KV within {limit:g} s"
                self._tell(t["ident"], wire.Failed(room=room, error=error))
                self.emit(wire.SentEvent(room=room, error=error))
            else:
                self._advance(room)
        for room in [r for r, (_, since) in self.sends.items() if now - since > limit]:
            del self.sends[room]
            error = (
                f"the decode server did not ask for the KV within {limit:g} s "
                "(--disaggregation-transfer-timeout)"
            )
            self._remember_ended(room, error)
            self.emit(wire.SentEvent(room=room, error=error))
        for room in [r for r, g in self.regs.items() if now - g["since"] > limit]:
            self._end(room, f"no request for this room reached the prefill server in {limit:g} s")
        for room in [r for r, (_, t) in self.ended.items() if now - t > 2 * limit]:
            del self.ended[room]

    def close_sockets(self) -> None:
        close_bootstrap(self.net, self.router, self.auth)
