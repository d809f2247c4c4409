"""The decode server's transfer agent: one ZeroMQ DEALER (CURVE client: channel.py) per configured
prefill server it has rooms at (--disaggregation-prefill-addrs: a request only picks one of them).
It registers each room's pages (expect), copies the `pages` messages of that room, from that peer,
into exactly those pages in order, and reports the room `arrived` on `done` (all pages received, the
first token in vocabulary) or `failed`. What a peer sends is decoded as its type (wire.py) and
checked (peer_checks.py); a message that is wrong fails its room alone, and one that names no room
this side can read, or an op it does not take, is dropped.

Bytes land only when a `pages` message for a room still pending here arrives, so a room that ends
here (cancelled, timed out, failed) is reported failed at once: its pages take no later bytes. A
prefill server silent for PEER_SILENT_S (pinged every PING_S while it has rooms) fails its rooms.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from radixrt.runtime.disaggregation import wire
from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.channel import CONTROL_MAX_BYTES, peer_socket
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.peer_checks import PeerError, check_first, error_text
from radixrt.runtime.disaggregation.prefill_agent import chunk_pages

log = logging.getLogger(__name__)

PING_S = 1.0  # a prefill server with rooms in flight is pinged this often
PEER_SILENT_S = 5.0  # ... and given up (its rooms failed) after this long without a word


class Peer:
    def __init__(self, sock: zmq.Socket, now: float):
        self.sock = sock
        self.heard = self.pinged = self.used = now  # last heard from, pinged, sent anything to
        self.rooms: set[int] = set()


class DecodeAgent(Agent):
    commands = wire.DECODE_COMMANDS

    def __init__(
        self,
        ctx,
        cmd_addr,
        evt_addr,
        timeout_s,
        layout: KVLayout,
        pages: PageBytes,
        secret: str,
        prefill_addrs: frozenset[str],
        vocab_size: int,
    ):
        """pages: this pool's bytes; prefill_addrs: the "host:port" bootstrap addresses this server
        may take KV from; vocab_size: the first token's bound."""
        super().__init__(ctx, cmd_addr, evt_addr, timeout_s)
        self.layout, self.pages, self.secret = layout, pages, secret
        self.prefill_addrs, self.vocab_size = prefill_addrs, vocab_size
        self.net = zmq.Context()  # the peer sockets' own (CURVE clients)
        per_message = chunk_pages(layout.bytes_per_page) * layout.bytes_per_page
        self.max_message = per_message + CONTROL_MAX_BYTES
        self.peers: dict[str, Peer] = {}  # "host:port" of a bootstrap port -> its socket
        self.pending: dict[int, dict[str, Any]] = {}  # room -> addr, since, pages, received

    def _peer(self, addr: str) -> Peer:
        if addr not in self.prefill_addrs:
            raise PeerError(f"{addr} is not a configured prefill server")
        if addr not in self.peers:
            sock = peer_socket(self.net, self.secret, addr, self.max_message)
            self.poller.register(sock, zmq.POLLIN)
            self.peers[addr] = Peer(sock, time.monotonic())
        return self.peers[addr]

    def _send(self, peer: Peer, msg: wire.PeerMessage) -> None:
        peer.used = time.monotonic()
        peer.sock.send(wire.encode(msg))

    def on_command(self, cmd: wire.Command) -> None:
        if isinstance(cmd, wire.ExpectCommand):
            room, addr = cmd.room, cmd.addr
            try:
                peer = self._peer(addr)
            except Exception as e:  # the request fails; nothing of it is left here
                self.emit(wire.FailedEvent(room=room, error=f"prefill server {addr}: {e}"))
                return
            if not peer.rooms:  # its silence counts from now, not from its last room
                peer.heard = peer.pinged = time.monotonic()
            peer.rooms.add(room)
            self.pending[room] = {
                "addr": addr,
                "since": time.monotonic(),
                "pages": cmd.pages,
                "received": 0,
            }
            fields = {"num_pages": len(cmd.pages), "start": cmd.start}
            self._send(peer, wire.Register(room=room, layout=self.layout, **fields))
        elif isinstance(cmd, wire.CancelCommand):
            self._cancel(cmd.room, "aborted by the client")

    def _cancel(self, room: int, why: str) -> None:
        """The room ends here now; the prefill server is asked to drop it (it may be queued)."""
        entry = self.pending.get(room)
        if entry is None:
            return
        self._send(self.peers[entry["addr"]], wire.Cancel(room=room))
        self._finish(wire.FailedEvent(room=room, error=why))

    def _finish(self, event: wire.ArrivedEvent | wire.FailedEvent) -> None:
        """The room ends here with event, if it was still pending."""
        entry = self.pending.pop(event.room, None)
        if entry is None:
            return
        peer = self.peers.get(entry["addr"])
        if peer is not None:
            peer.rooms.discard(event.room)
        self.emit(event)

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        addr = next((a for a, p in self.peers.items() if p.sock is sock), None)
        if addr is None:
            return
        self.peers[addr].heard = time.monotonic()
        try:
            msg = wire.FROM_PREFILL.decode(frames[0].buffer)
        except wire.BadMessage as e:
            # one of an op this side takes, its room read: that room fails (if it is this peer's);
            # anything else is dropped
            if e.kind is None or e.room is None or not self._invalid(addr, e.room, e.kind, e):
                log.warning("a message of prefill server %s ignored: %s", addr, e)
            return
        if isinstance(msg, wire.Pong):
            return
        # no check_room: a room past u64 was never registered here, so it is not pending
        entry = self.pending.get(msg.room)
        if entry is None or entry["addr"] != addr:
            return  # a room ended here, or another peer's: nothing of it is taken
        try:
            self._on_room_message(msg.room, entry, msg, frames[1:])
        except (PeerError, ValueError) as e:
            self._invalid(addr, msg.room, type(msg), e)

    def _invalid(self, addr: str, room: int, kind: type, e: Exception) -> bool:
        """addr sent a message of kind for room that cannot be taken: the room fails if it is that
        peer's and pending here (then True)."""
        entry = self.pending.get(room)
        if entry is None or entry["addr"] != addr:
            return False
        self._cancel(room, f"prefill server {addr} sent an invalid {wire.op_of(kind)!r}: {e}")
        return True

    def _on_room_message(
        self, room: int, entry: dict[str, Any], msg: wire.PeerMessage, data: list[zmq.Frame]
    ) -> None:
        addr, registered = entry["addr"], len(entry["pages"])
        if isinstance(msg, wire.Pages):
            start = entry["received"]
            if len(data) != 1 or start + msg.count > registered:
                raise PeerError(f"{msg.count} pages past the {registered} registered")
            self.pages.scatter(data[0].buffer, entry["pages"][start : start + msg.count])
            entry["received"] = start + msg.count
            entry.setdefault("first_chunk_at", time.monotonic())
        elif isinstance(msg, wire.Done):
            if entry["received"] != registered:
                raise PeerError(f"{entry['received']} of {registered} pages came")
            check_first(msg.first, self.vocab_size)
            num_bytes = self.pages.nbytes(registered)
            # on the wire from the first chunk's arrival (the wait for the prefill server to compute
            # the prompt is not the transfer's); all but the first chunk's own transit
            seconds = time.monotonic() - entry.get("first_chunk_at", time.monotonic())
            stats = {"num_pages": registered, "num_bytes": num_bytes, "seconds": seconds}
            self._finish(wire.ArrivedEvent(room=room, first=msg.first, **stats))
        elif isinstance(msg, wire.Failed):
            error = f"prefill server {addr}: {error_text(msg.error)}"
            self._finish(wire.FailedEvent(room=room, error=error))
        elif isinstance(msg, wire.Cancelled):
            self._finish(wire.FailedEvent(room=room, error="cancelled by the prefill server"))

    def tick(self, now: float) -> None:
        for room, entry in list(self.pending.items()):
            if now - entry["since"] > self.timeout_s:
                why = (
                    f"the prefill server {entry['addr']} did not send the KV within "
                    f"{self.timeout_s:g} s (--disaggregation-transfer-timeout)"
                )
                self._cancel(room, why)
        for addr, peer in list(self.peers.items()):
            if not peer.rooms:  # nothing in flight there: its socket goes after a quiet while
                if now - max(peer.heard, peer.used) > PEER_SILENT_S:
                    self._forget(addr)
                continue
            if now - peer.heard > PEER_SILENT_S:
                error = (
                    f"the prefill server {addr} stopped answering (nothing for "
                    f"{PEER_SILENT_S:g} s; one with another --disaggregation-channel-secret is "
                    "never heard)"
                )
                for room in list(peer.rooms):
                    self._finish(wire.FailedEvent(room=room, error=error))
                self._forget(addr)
            elif now - peer.pinged >= PING_S:
                peer.pinged = now
                self._send(peer, wire.Ping())

    def _forget(self, addr: str) -> None:
        peer = self.peers.pop(addr)
        self.poller.unregister(peer.sock)
        peer.sock.close(linger=0)

    def close_sockets(self) -> None:
        for peer in self.peers.values():
            peer.sock.close(linger=0)
        self.net.term()
