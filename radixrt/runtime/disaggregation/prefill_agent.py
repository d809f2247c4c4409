"""The prefill server's transfer agent: its bootstrap port (a ZeroMQ ROUTER on
--disaggregation-bootstrap-port) takes the decode servers' page registrations; once the scheduler
has computed a room's prompt (send) and its decode server has registered pages for it, the agent
writes the pages with Mooncake and tells the decode server `done` with the first token.

Pages in few runs are written straight into the registered pages; scattered ones are staged
(page_stager.py): gathered here, the decode side asked for a buffer (`stage` -> `staging`), written
in one piece and scattered there.

Either half may come first; each waits at most --disaggregation-transfer-timeout for the other. A
room dropped here (aborted, refused) or cancelled there is remembered for as long, so the late half
is answered at once instead of waiting out the timeout.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.kv_layout import KVLayout, regions
from radixrt.runtime.disaggregation.page_stager import PageStager

DIRECT_MAX_REGIONS = 1024  # more regions than this: staged (Mooncake refuses ~2k in one batch)


class PrefillAgent(Agent):
    def __init__(
        self,
        ctx,
        cmd_addr,
        evt_addr,
        timeout_s,
        engine,
        layout: KVLayout,
        stager: PageStager,
        bind: str,
    ):
        """stager: a PageStager over the pool; bind: the bootstrap endpoint (tcp://host:port),
        bound now so a taken port fails the server's start with its name."""
        super().__init__(ctx, cmd_addr, evt_addr, timeout_s)
        self.engine, self.layout, self.stager = engine, layout, stager
        self.router = ctx.socket(zmq.ROUTER)
        try:
            self.router.bind(bind)
        except zmq.ZMQError as e:
            self.router.close(linger=0)
            raise RuntimeError(f"cannot bind the bootstrap port {bind}: {e}") from None
        self.poller.register(self.router, zmq.POLLIN)
        self.sends: dict[int, dict[str, Any]] = {}  # room -> pages, first token, since
        self.regs: dict[int, dict[str, Any]] = {}  # room -> the decode side's registration
        self.ended: dict[int, tuple[str, float]] = {}  # room -> why it will not be sent, since
        self.staged: dict[int, dict[str, Any]] = {}  # room -> gathered, waiting for a buffer there

    def on_command(self, msg: dict[str, Any]) -> None:
        room = msg["room"]
        if msg["op"] == "send":
            if room in self.ended:
                self.emit("sent", room=room, error=self.ended[room][0])
                return
            self.sends[room] = {**msg, "since": time.monotonic()}
            self._try_transfer(room)
        elif msg["op"] == "drop":
            job = self.staged.get(room)
            self._end(room, msg["error"])
            if job is not None:  # gathered, its decode side about to give a buffer: it fails
                self._unstage(room)
                self._failed(room, job, RuntimeError(msg["error"]))
            elif self.sends.pop(room, None) is not None:
                self.emit("sent", room=room, error=msg["error"])

    def _end(self, room: int, error: str) -> None:
        """The room will not be sent: its registered decode side is told now, a later one then."""
        self.ended[room] = (error, time.monotonic())
        reg = self.regs.pop(room, None)
        if reg is not None:
            self.reply(self.router, reg["ident"], "failed", room=room, error=error)

    def on_peer(self, sock: zmq.Socket, ident: list[bytes], msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "ping":
            self.reply(sock, ident, "pong")
            return
        room = msg["room"]
        if op == "register":
            if room in self.ended:
                self.reply(sock, ident, "failed", room=room, error=self.ended[room][0])
                return
            self.regs[room] = {**msg, "ident": ident, "since": time.monotonic()}
            self._try_transfer(room)
        elif op == "cancel":
            self.regs.pop(room, None)
            self.ended[room] = ("cancelled by the decode server", time.monotonic())
            if self.sends.pop(room, None) is not None or self._unstage(room):
                self.emit("sent", room=room, error="cancelled by the decode server")
            self.reply(sock, ident, "cancelled", room=room)
        elif op == "staging" and room in self.staged:
            self._write_staged(room, msg["addr"])

    def _try_transfer(self, room: int) -> None:
        """Both halves are here: write the pages (or stage them), then tell both sides."""
        if room not in self.sends or room not in self.regs:
            return
        send, reg = self.sends.pop(room), self.regs.pop(room)
        job = {"reg": reg, "first": send["first"], "started": time.perf_counter()}
        try:
            job["pages"] = send["pages"][reg["start"] :]
            dst = KVLayout.from_wire(reg["layout"])
            srcs, dsts, lens = regions(self.layout, job["pages"], dst, reg["pages"])
            if len(srcs) > DIRECT_MAX_REGIONS:  # scattered: one piece, through buffers
                job["buf"] = self.stager.gather(job["pages"])
                job["since"] = time.monotonic()
                self.staged[room] = job
                self.reply(self.router, reg["ident"], "stage", room=room, num_bytes=sum(lens))
                return
            self.engine.write(reg["session"], srcs, dsts, lens)
        except Exception as e:
            self._failed(room, job, e)
            return
        self._done(room, job, sum(lens))

    def _write_staged(self, room: int, addr: int) -> None:
        job = self.staged.pop(room)
        buf = job["buf"]
        try:
            self.engine.write(job["reg"]["session"], [buf.data_ptr()], [addr], [buf.numel()])
        except Exception as e:
            self._failed(room, job, e)
            return
        finally:
            self.stager.release(buf)
        self._done(room, job, buf.numel())

    def _unstage(self, room: int) -> bool:
        job = self.staged.pop(room, None)
        if job is not None:
            self.stager.release(job["buf"])
        return job is not None

    def _done(self, room: int, job: dict[str, Any], num_bytes: int) -> None:
        seconds = time.perf_counter() - job["started"]
        done = {"num_pages": len(job["pages"]), "num_bytes": num_bytes, "seconds": seconds}
        reg = job["reg"]
        self.reply(self.router, reg["ident"], "done", room=room, first=job["first"], **done)
        self.emit("sent", room=room, error=None, **done)

    def _failed(self, room: int, job: dict[str, Any], e: Exception) -> None:
        """The decode side frees its pages; this one finishes with the error."""
        error = str(e) or type(e).__name__
        self.reply(self.router, job["reg"]["ident"], "failed", room=room, error=error)
        self.emit("sent", room=room, error=error)

    def tick(self, now: float) -> None:
        limit = self.timeout_s
        for room in [r for r, s in self.sends.items() if now - s["since"] > limit]:
            del self.sends[room]
            error = (
                f"the decode server did not ask for the KV within {limit:g} s "
                "(--disaggregation-transfer-timeout)"
            )
            self.ended[room] = (error, now)
            self.emit("sent", room=room, error=error)
        for room in [r for r, j in self.staged.items() if now - j["since"] > limit]:
            job = self.staged[room]
            self._unstage(room)
            self._failed(room, job, RuntimeError(f"no staging buffer came within {limit:g} s"))
        for room in [r for r, g in self.regs.items() if now - g["since"] > limit]:
            self._end(room, f"no request for this room reached the prefill server in {limit:g} s")
        for room in [r for r, (_, t) in self.ended.items() if now - t > 2 * limit]:
            del self.ended[room]

    def close_sockets(self) -> None:
        self.router.close(linger=0)
