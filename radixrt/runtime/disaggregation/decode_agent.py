"""The decode server's transfer agent: one ZeroMQ DEALER per prefill server it has rooms at. It
registers each room's pages (expect), and reports the room `arrived` (the prefill server's `done`)
or `failed`. A staged transfer (page_stager.py) asks for a buffer first (`stage`): one is registered
for it, and on `done` its bytes are scattered into the room's pages.

A room's pages are reported free to reuse (`failed`) only when no more bytes can land in them: the
prefill side answered (failed, or cancelled after a cancel), or it stopped answering pings for
PEER_SILENT_S (a killed server writes nothing). A room waiting past the transfer timeout is
cancelled, and fails when that cancel is answered.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import zmq

from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.kv_layout import KVLayout

PING_S = 1.0  # a prefill server with rooms in flight is pinged this often
PEER_SILENT_S = 5.0  # ... and given up (its rooms failed) after this long without a word


class Peer:
    def __init__(self, sock: zmq.Socket, now: float):
        self.sock = sock
        self.heard = self.pinged = self.used = now  # last heard from, pinged, sent anything to
        self.rooms: set[int] = set()


class DecodeAgent(Agent):
    def __init__(self, ctx, cmd_addr, evt_addr, timeout_s, session: str, layout: KVLayout, stager):
        """stager: a PageStager over this pool (staged transfers)."""
        super().__init__(ctx, cmd_addr, evt_addr, timeout_s)
        self.session, self.layout, self.stager = session, layout, stager
        self.peers: dict[str, Peer] = {}  # "host:port" of a bootstrap port -> its socket
        self.pending: dict[int, dict[str, Any]] = {}  # room -> addr, since, why it is cancelled

    def _peer(self, addr: str) -> Peer:
        if addr not in self.peers:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{addr}")
            self.poller.register(sock, zmq.POLLIN)
            self.peers[addr] = Peer(sock, time.monotonic())
        return self.peers[addr]

    def _send(self, peer: Peer, op: str, **fields: Any) -> None:
        peer.used = time.monotonic()
        peer.sock.send(orjson.dumps({"op": op, **fields}))

    def on_command(self, msg: dict[str, Any]) -> None:
        room, addr = msg["room"], msg["addr"]
        if msg["op"] == "expect":
            peer = self._peer(addr)
            if not peer.rooms:  # its silence counts from now, not from its last room
                peer.heard = peer.pinged = time.monotonic()
            peer.rooms.add(room)
            self.pending[room] = {
                "addr": addr,
                "since": time.monotonic(),
                "cancelled": None,
                "pages": msg["pages"],
                "buf": None,
            }
            register = {"session": self.session, "layout": self.layout.to_wire()}
            self._send(
                peer, "register", room=room, pages=msg["pages"], start=msg["start"], **register
            )
        elif msg["op"] == "cancel":
            self._cancel(room, addr, "aborted by the client")

    def _cancel(self, room: int, addr: str, why: str) -> None:
        """Ask the prefill server to drop the room (it may still have been queued there)."""
        entry = self.pending.get(room)
        if entry is not None:
            if entry["cancelled"] is not None:
                return
            entry["cancelled"] = why
        self._send(self._peer(addr), "cancel", room=room)

    def _finish(self, room: int, kind: str, **fields: Any) -> None:
        entry = self.pending.pop(room, None)
        if entry is None:
            return
        if entry["buf"] is not None:
            if kind == "arrived":
                self.stager.scatter(entry["buf"], entry["pages"])
            self.stager.release(entry["buf"])
        peer = self.peers.get(entry["addr"])
        if peer is not None:
            peer.rooms.discard(room)
        self.emit(kind, room=room, **fields)

    def on_peer(self, sock: zmq.Socket, ident: list[bytes], msg: dict[str, Any]) -> None:
        addr = next((a for a, p in self.peers.items() if p.sock is sock), None)
        if addr is not None:
            self.peers[addr].heard = time.monotonic()
        op = msg["op"]
        if op == "stage":
            self._stage(sock, msg["room"], msg["num_bytes"])
        elif op == "done":
            fields = {k: msg[k] for k in ("first", "num_pages", "num_bytes", "seconds")}
            self._finish(msg["room"], "arrived", **fields)
        elif op == "failed":
            self._finish(msg["room"], "failed", error=f"prefill server {addr}: {msg['error']}")
        elif op == "cancelled":
            entry = self.pending.get(msg["room"])
            why = (entry or {}).get("cancelled") or "cancelled"
            self._finish(msg["room"], "failed", error=why)

    def _stage(self, sock: zmq.Socket, room: int, num_bytes: int) -> None:
        """A buffer for a staged transfer into a room still wanted (else the prefill side drops
        it)."""
        entry = self.pending.get(room)
        if entry is None or entry["cancelled"] is not None:
            sock.send(orjson.dumps({"op": "cancel", "room": room}))
            return
        if entry["buf"] is None:
            entry["buf"] = self.stager.buffer(num_bytes)
        sock.send(orjson.dumps({"op": "staging", "room": room, "addr": entry["buf"].data_ptr()}))

    def tick(self, now: float) -> None:
        for room, entry in list(self.pending.items()):
            if entry["cancelled"] is None and now - entry["since"] > self.timeout_s:
                why = (
                    f"the prefill server {entry['addr']} did not send the KV within "
                    f"{self.timeout_s:g} s (--disaggregation-transfer-timeout)"
                )
                self._cancel(room, entry["addr"], why)
        for addr, peer in list(self.peers.items()):
            if not peer.rooms:  # nothing in flight there: its socket goes after a quiet while
                if now - max(peer.heard, peer.used) > PEER_SILENT_S:
                    self._forget(addr)
                continue
            if now - peer.heard > PEER_SILENT_S:
                error = (
                    f"the prefill server {addr} stopped answering (nothing for {PEER_SILENT_S:g} s)"
                )
                for room in list(peer.rooms):
                    entry = self.pending.get(room) or {}
                    self._finish(room, "failed", error=entry.get("cancelled") or error)
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
