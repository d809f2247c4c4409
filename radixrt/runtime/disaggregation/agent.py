"""The transfer agent: a thread in the scheduler process that talks to the peer server over the
authenticated channel (channel.py: ZeroMQ over TCP with CURVE) and moves the pages' bytes, so that
neither a slow peer nor a transfer holds up the scheduler's loop. The scheduler's commands come in,
and its events go out, over two inproc PAIR sockets (transfer.py holds their other ends); each
socket is used by this thread alone.

Wire messages (orjson dicts, "op" names them), decode -> prefill's bootstrap port:
  register {room, layout, num_pages, start}  cancel {room}  ping {}
prefill -> decode:
  pages {room, count} + a frame of whole pages' bytes (in order, as many as it takes)
  done {room, first, num_pages, num_bytes}
  failed {room, error}  cancelled {room}  pong {}
Every field that arrives is checked (peer_checks.py) before it is used.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import orjson
import zmq

log = logging.getLogger(__name__)

TICK_MS = 200  # how often timeouts and peers are looked at when no message comes


class Agent(threading.Thread):
    def __init__(self, ctx: zmq.Context, cmd_addr: str, evt_addr: str, timeout_s: float):
        super().__init__(name=f"kv-{type(self).__name__}", daemon=True)
        self.ctx, self.timeout_s = ctx, timeout_s
        self.cmd_addr, self.evt_addr = cmd_addr, evt_addr
        self.poller = zmq.Poller()
        self.stopping = False

    def run(self) -> None:
        self.cmd = self.ctx.socket(zmq.PAIR)
        self.cmd.connect(self.cmd_addr)
        self.evt = self.ctx.socket(zmq.PAIR)
        self.evt.connect(self.evt_addr)
        self.poller.register(self.cmd, zmq.POLLIN)
        try:
            while not self.stopping:
                ready = dict(self.poller.poll(self.poll_ms()))
                for sock in ready:
                    self._drain(sock)
                self.tick(time.monotonic())
        except Exception:  # the link is gone: the scheduler's requests time out, loudly
            log.exception("the KV transfer agent stopped")
        finally:
            self.close_sockets()
            self.cmd.close(linger=0)
            self.evt.close(linger=100)

    def _drain(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=sock is self.cmd)
            except zmq.Again:
                return
            try:
                if sock is self.cmd:
                    msg = orjson.loads(frames[-1])
                    if msg["op"] == "close":
                        self.stopping = True
                    else:
                        self.on_command(msg)
                else:
                    self.on_peer(sock, frames)
            except Exception:  # one bad message must not end the agent
                log.exception("handling a KV transfer message failed")

    def emit(self, kind: str, **fields: Any) -> None:
        """An event for the scheduler (transfer.py turns it into a kv_transfer event)."""
        self.evt.send(orjson.dumps({"kind": kind, **fields}))

    @staticmethod
    def reply(sock: zmq.Socket, ident: list[bytes], op: str, flags: int = 0, **fields: Any) -> None:
        sock.send_multipart([*ident, orjson.dumps({"op": op, **fields})], flags=flags)

    def poll_ms(self) -> int:
        """How long the loop may wait for a message before tick runs."""
        return TICK_MS

    # a side's own
    def on_command(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        """frames: what the peer socket received (a ROUTER's start with the sender's identity)."""
        raise NotImplementedError

    def tick(self, now: float) -> None:
        raise NotImplementedError

    def close_sockets(self) -> None:
        raise NotImplementedError
