"""The transfer agent: a thread in the scheduler process that talks to the peer server over the
authenticated channel (channel.py: ZeroMQ over TCP with CURVE) and moves the pages' bytes, so that
neither a slow peer nor a transfer holds up the scheduler's loop. The scheduler's commands come in,
and its events go out, over two inproc PAIR sockets (transfer.py holds their other ends); each
socket is used by this thread alone.

Wire messages (wire.py's Structs: a JSON object, "op" names it), decode -> prefill's bootstrap port:
  register {room, layout: {page_bytes}, num_pages, start}  cancel {room}  ping {}
prefill -> decode:
  pages {room, count} + a frame of whole pages' bytes (in order, as many as it takes)
  done {room, first: {id, logprob, top_logprobs}, num_pages, num_bytes}
  failed {room, error}  cancelled {room}  pong {}
Each side decodes them with one decoder over the ops it takes (wire.FROM_DECODE, FROM_PREFILL): a
field of the wrong type or out of its bounds, an unknown field or op refuses the message, and what
no type says is checked on the decoded values (peer_checks.py) before it is used.
The scheduler's commands (wire.Command: send, drop; expect, cancel; close) and this thread's
events (wire.Event: sent; arrived, failed) are Structs too.
"""

from __future__ import annotations

import logging
import threading
import time

import msgspec
import zmq

from radixrt.runtime.disaggregation.wire import CloseCommand, Command, Event, PeerMessage, encode

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
                    cmd = self.commands.decode(frames[-1])
                    if isinstance(cmd, CloseCommand):
                        self.stopping = True
                    else:
                        self.on_command(cmd)
                else:
                    self.on_peer(sock, frames)
            except Exception:  # one bad message must not end the agent
                log.exception("handling a KV transfer message failed")

    def emit(self, event: Event) -> None:
        """An event for the scheduler (transfer.py turns it into a kv_transfer event)."""
        self.evt.send(encode(event))

    @staticmethod
    def reply(sock: zmq.Socket, ident: list[bytes], msg: PeerMessage, flags: int = 0) -> None:
        sock.send_multipart([*ident, encode(msg)], flags=flags)

    def poll_ms(self) -> int:
        """How long the loop may wait for a message before tick runs."""
        return TICK_MS

    # a side's own
    commands: msgspec.json.Decoder  # of the commands it takes (wire.PREFILL_COMMANDS, ...)

    def on_command(self, cmd: Command) -> None:
        raise NotImplementedError

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        """frames: what the peer socket received (a ROUTER's start with the sender's identity)."""
        raise NotImplementedError

    def tick(self, now: float) -> None:
        raise NotImplementedError

    def close_sockets(self) -> None:
        raise NotImplementedError
