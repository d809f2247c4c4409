"""The decode server's transfer agent: one ZeroMQ DEALER (CURVE client: channel.py) per configured
prefill server it has rooms at (--disaggregation-prefill-addrs: a request only picks one of them).
It registers each room's pages (expect), copies the `pages` messages of that room, from that peer,
into exactly those pages in order, and reports the room `arrived` on `done` (all pages received, the
first token in vocabulary) or `failed`. Anything else a peer sends is checked (peer_checks.py) and,
when wrong, fails that room alone.

Bytes land only when a `pages` message for a room still pending here arrives, so a room that ends
here (cancelled, timed out, failed) is reported failed at once: its pages take no later bytes. A
prefill server silent for PEER_SILENT_S (pinged every PING_S while it has rooms) fails its rooms.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
import zmq

from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.channel import CONTROL_MAX_BYTES, peer_socket
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.peer_checks import (
    PeerError,
    check_first,
    check_int,
    check_room,
    error_text,
    header,
)
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

    def _send(self, peer: Peer, op: str, **fields: Any) -> None:
        peer.used = time.monotonic()
        peer.sock.send(orjson.dumps({"op": op, **fields}))

    def on_command(self, msg: dict[str, Any]) -> None:
        room, addr = msg["room"], msg["addr"]
        if msg["op"] == "expect":
            try:
                peer = self._peer(addr)
            except Exception as e:  # the request fails; nothing of it is left here
                self.emit("failed", room=room, error=f"prefill server {addr}: {e}")
                return
            if not peer.rooms:  # its silence counts from now, not from its last room
                peer.heard = peer.pinged = time.monotonic()
            peer.rooms.add(room)
            self.pending[room] = {
                "addr": addr,
                "since": time.monotonic(),
                "pages": msg["pages"],
                "received": 0,
            }
            fields = {"num_pages": len(msg["pages"]), "start": msg["start"]}
            self._send(peer, "register", room=room, layout=self.layout.to_wire(), **fields)
        elif msg["op"] == "cancel":
            self._cancel(room, "aborted by the client")

    def _cancel(self, room: int, why: str) -> None:
        """The room ends here now; the prefill server is asked to drop it (it may be queued)."""
        entry = self.pending.get(room)
        if entry is None:
            return
        self._send(self.peers[entry["addr"]], "cancel", room=room)
        self._finish(room, "failed", error=why)

    def _finish(self, room: int, kind: str, **fields: Any) -> None:
        entry = self.pending.pop(room, None)
        if entry is None:
            return
        peer = self.peers.get(entry["addr"])
        if peer is not None:
            peer.rooms.discard(room)
        self.emit(kind, room=room, **fields)

    def on_peer(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        addr = next((a for a, p in self.peers.items() if p.sock is sock), None)
        if addr is None:
            return
        self.peers[addr].heard = time.monotonic()
        try:
            msg = header(frames[0])
            if msg["op"] == "pong":
                return
            room = check_room(msg.get("room"))
        except PeerError as e:
            log.warning("a message of prefill server %s ignored: %s", addr, e)
            return
        entry = self.pending.get(room)
        if entry is None or entry["addr"] != addr:
            return  # a room ended here, or another peer's: nothing of it is taken
        try:
            self._on_room_message(room, entry, msg, frames[1:])
        except (PeerError, ValueError) as e:
            self._cancel(room, f"prefill server {addr} sent an invalid {msg['op']!r}: {e}")

    def _on_room_message(
        self, room: int, entry: dict[str, Any], msg: dict[str, Any], data: list[zmq.Frame]
    ) -> None:
        op, addr = msg["op"], entry["addr"]
        if op == "pages":
            count = check_int(msg.get("count"), "count", 1, len(entry["pages"]))
            start = entry["received"]
            if len(data) != 1 or start + count > len(entry["pages"]):
                raise PeerError(f"{count} pages past the {len(entry['pages'])} registered")
            self.pages.scatter(data[0].buffer, entry["pages"][start : start + count])
            entry["received"] = start + count
            entry.setdefault("first_chunk_at", time.monotonic())
        elif op == "done":
            if entry["received"] != len(entry["pages"]):
                raise PeerError(f"{entry['received']} of {len(entry['pages'])} pages came")
            first = check_first(msg.get("first"), self.vocab_size)
            num_bytes = self.pages.nbytes(len(entry["pages"]))
            # on the wire from the first chunk's arrival (the wait for the prefill server to compute
            # the prompt is not the transfer's); all but the first chunk's own transit
            seconds = time.monotonic() - entry.get("first_chunk_at", time.monotonic())
            stats = {"num_pages": len(entry["pages"]), "num_bytes": num_bytes, "seconds": seconds}
            self._finish(room, "arrived", first=first, **stats)
        elif op == "failed":
            error = error_text(msg.get("error"))
            self._finish(room, "failed", error=f"prefill server {addr}: {error}")
        elif op == "cancelled":
            self._finish(room, "failed", error="cancelled by the prefill server")

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
                    self._finish(room, "failed", error=error)
                self._forget(addr)
            elif now - peer.pinged >= PING_S:
                peer.pinged = now
                self._send(peer, "ping")

    def _forget(self, addr: str) -> None:
        peer = self.peers.pop(addr)
        self.poller.unregister(peer.sock)
        peer.sock.close(linger=0)

    def close_sockets(self) -> None:
        for peer in self.peers.values():
            peer.sock.close(linger=0)
        self.net.term()
