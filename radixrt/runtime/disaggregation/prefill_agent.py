"""The prefill server's transfer agent: its bootstrap port (a ZeroMQ ROUTER on
--disaggregation-bootstrap-port, bound to --host, CURVE-authenticated: channel.py) takes the decode
servers' registrations; once the scheduler has computed a room's prompt (send) and its decode server
has registered pages for it, the agent sends the pages' bytes in chunks of whole pages (`pages`)
and then `done` with the first token.

A room is registered once: a second registration for a room already registered or sent is refused
(the first stands). Either half may come first; each waits at most --disaggregation-transfer-timeout
for the other. A room dropped here (aborted, refused) or cancelled there is remembered for as long,
so the late half is answered at once instead of waiting out the timeout.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
import zmq

from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.channel import bootstrap_socket, close_bootstrap
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.peer_checks import PeerError, check_int, check_room, header

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20  # the pages travel in messages of about this size (whole pages each)
MAX_PAGES = 1 << 24
# rooms registered and rooms remembered as ended: a decode server (even an authenticated one) names
# them, so neither table may grow without bound; the oldest ended room is forgotten first
MAX_ROOMS = 1 << 16


def chunk_pages(bytes_per_page: int) -> int:
    """Pages per `pages` message: CHUNK_BYTES of them, at least one."""
    return max(1, CHUNK_BYTES // max(1, bytes_per_page))


class PrefillAgent(Agent):
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
        self.net, self.router, self.auth = bootstrap_socket(secret, bind)
        # a send to a decode server that is gone raises (instead of vanishing), and the queue of a
        # slow one is bounded by the rooms in flight, not by a message count that would drop chunks
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 0)
        self.poller.register(self.router, zmq.POLLIN)
        self.sends: dict[int, dict[str, Any]] = {}  # room -> pages, first token, since
        self.regs: dict[int, dict[str, Any]] = {}  # room -> the decode side's registration
        self.ended: dict[int, tuple[str, float]] = {}  # room -> why it will not be sent, since

    def on_command(self, msg: dict[str, Any]) -> None:
        room = msg["room"]
        if msg["op"] == "send":
            if room in self.ended:
                self.emit("sent", room=room, error=self.ended[room][0])
                return
            self.sends[room] = {**msg, "since": time.monotonic()}
            self._try_transfer(room)
        elif msg["op"] == "drop":
            self._end(room, msg["error"])
            if self.sends.pop(room, None) is not None:
                self.emit("sent", room=room, error=msg["error"])

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
            self._tell(reg["ident"], "failed", room=room, error=error)

    def _tell(self, ident: list[bytes], op: str, **fields: Any) -> bool:
        """A message to one decode server; False when it is no longer connected."""
        try:
            self.reply(self.router, ident, op, **fields)
            return True
        except zmq.ZMQError:
            return False

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        if len(frames) != 2:
            log.warning("a bootstrap message of %d frames ignored", len(frames))
            return
        ident = [frames[0].bytes]
        try:
            msg = header(frames[1])
            if msg["op"] == "ping":
                self._tell(ident, "pong")
                return
            room = check_room(msg.get("room"))
        except PeerError as e:
            log.warning("a decode server's message ignored: %s", e)
            return
        if msg["op"] == "register":
            self._register(ident, room, msg)
        elif msg["op"] == "cancel":
            reg = self.regs.get(room)
            if reg is not None and reg["ident"] != ident:
                return  # only the decode server that registered a room may cancel it
            self.regs.pop(room, None)
            self._remember_ended(room, "cancelled by the decode server")
            if self.sends.pop(room, None) is not None:
                self.emit("sent", room=room, error="cancelled by the decode server")
            self._tell(ident, "cancelled", room=room)

    def _register(self, ident: list[bytes], room: int, msg: dict[str, Any]) -> None:
        if room in self.ended:
            self._tell(ident, "failed", room=room, error=self.ended[room][0])
            return
        if room in self.regs:  # the first registration stands; the second learns why not
            self._tell(ident, "failed", room=room, error=f"room {room} is already registered")
            return
        if len(self.regs) >= MAX_ROOMS:
            self._tell(ident, "failed", room=room, error=f"{MAX_ROOMS} rooms already registered")
            return
        try:
            # the layout is compared now and not kept: a registration holds a few ints, however
            # large the layout it sent (#56.3: 65,536 rooms of 4,096-int layouts were ~10 GB)
            self.layout.check_same(KVLayout.from_wire(msg.get("layout")))
            reg = {
                "ident": ident,
                "num_pages": check_int(msg.get("num_pages"), "num_pages", 0, MAX_PAGES),
                "start": check_int(msg.get("start"), "start", 0, MAX_PAGES),
                "since": time.monotonic(),
            }
        except (PeerError, ValueError) as e:
            error = f"registration refused: {e}"
            self._remember_ended(room, error)  # the room's send fails with it, now or when it comes
            if self.sends.pop(room, None) is not None:
                self.emit("sent", room=room, error=error)
            self._tell(ident, "failed", room=room, error=error)
            return
        self.regs[room] = reg
        self._try_transfer(room)

    def _try_transfer(self, room: int) -> None:
        """Both halves are here: send the pages and `done`, then tell the scheduler."""
        if room not in self.sends or room not in self.regs:
            return
        send, reg = self.sends.pop(room), self.regs.pop(room)
        started = time.perf_counter()
        # a room is sent once: a later registration of it is refused
        self._remember_ended(room, f"room {room} was already sent")
        pages = send["pages"][reg["start"] :]
        try:
            if len(pages) != reg["num_pages"]:
                raise ValueError(f"{reg['num_pages']} pages asked for, {len(pages)} to send")
            num_bytes = self._send_pages(reg["ident"], room, pages)
            done = {"room": room, "first": send["first"], "num_pages": len(pages)}
            self.reply(self.router, reg["ident"], "done", **done, num_bytes=num_bytes)
        except (ValueError, zmq.ZMQError) as e:
            error = str(e) or type(e).__name__
            self._tell(reg["ident"], "failed", room=room, error=error)
            self.emit("sent", room=room, error=error)
            return
        seconds = (
            time.perf_counter() - started
        )  # gathered and queued; the decode side times arrival
        done = {"num_pages": len(pages), "num_bytes": num_bytes, "seconds": seconds}
        self.emit("sent", room=room, error=None, **done)

    def _send_pages(self, ident: list[bytes], room: int, pages: list[int]) -> int:
        """The pages' bytes in `pages` messages of whole pages, in order; returns the bytes sent.
        Each gathered chunk is a copy, so the pool's pages may be reused once this returns."""
        step, sent = chunk_pages(self.layout.bytes_per_page), 0
        for i in range(0, len(pages), step):
            buf = self.pages.gather(pages[i : i + step])
            head = orjson.dumps({"op": "pages", "room": room, "count": len(pages[i : i + step])})
            self.router.send_multipart([*ident, head, memoryview(buf.numpy())], copy=False)
            sent += buf.numel()
        return sent

    def tick(self, now: float) -> None:
        limit = self.timeout_s
        for room in [r for r, s in self.sends.items() if now - s["since"] > limit]:
            del self.sends[room]
            error = (
                f"the decode server did not ask for the KV within {limit:g} s "
                "(--disaggregation-transfer-timeout)"
            )
            self._remember_ended(room, error)
            self.emit("sent", room=room, error=error)
        for room in [r for r, g in self.regs.items() if now - g["since"] > limit]:
            self._end(room, f"no request for this room reached the prefill server in {limit:g} s")
        for room in [r for r, (_, t) in self.ended.items() if now - t > 2 * limit]:
            del self.ended[room]

    def close_sockets(self) -> None:
        close_bootstrap(self.net, self.router, self.auth)
