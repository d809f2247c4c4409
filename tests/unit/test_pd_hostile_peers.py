"""Hostile peers of a prefill-decode pair, over real sockets on loopback: fake prefill servers that lie
to a real decode agent, fake decode servers that try to take or disturb a real prefill agent's rooms,
and peers without the pair's secret. Truth: the decode pool's bytes (untouched unless the real
prefill sent them), the events each real agent reports, and both agents still serving after.
"""

import contextlib
import json
import time

import orjson
import pytest
import torch
import zmq
from test_pd_agents import (
    FIRST,
    PAGE,
    SECRET,
    decode_link,
    linked,
    page,
    pool,
    prefill_link,
    wait_events,
)

from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation import prefill_agent
from radixrt.runtime.disaggregation.channel import bootstrap_socket, close_bootstrap, peer_socket
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.peer_checks import PeerError, check_first
from radixrt.runtime.disaggregation.prefill_agent import PrefillAgent
from radixrt.runtime.disaggregation.transfer import ThreadTransfer
from radixrt.runtime.processes import free_port
from radixrt.runtime.request.options import Bootstrap


class FakePrefill:
    """A bootstrap port holding the pair's secret, driven by the test."""

    def __init__(self, port):
        self.ctx, self.sock, self.auth = bootstrap_socket(SECRET, f"tcp://127.0.0.1:{port}")

    def registration(self, timeout=5.0):
        assert self.sock.poll(int(timeout * 1000)), "no registration came"
        ident, body = self.sock.recv_multipart()
        return ident, orjson.loads(body)

    def send(self, ident, op, *data, **fields):
        # the stdlib's json: it writes what orjson refuses to (integers past 64 bits)
        self.sock.send_multipart([ident, json.dumps({"op": op, **fields}).encode(), *data])

    def close(self):
        close_bootstrap(self.ctx, self.sock, self.auth)


def _lying_prefill(lie):
    """A real decode agent registers pages [5, 6] for room 9 with a fake prefill that answers
    with lie(fake, ident, registration); returns (decode events, the decode pool)."""
    port, dst = free_port(), pool(8, False)
    fake, d = FakePrefill(port), decode_link(dst, port)
    try:
        d.expect(Bootstrap("127.0.0.1", port, 9), [5, 6], 0)
        ident, reg = fake.registration()
        assert reg["op"] == "register" and reg["num_pages"] == 2 and "session" not in reg
        lie(fake, ident, reg)
        return wait_events(d), dst
    finally:
        d.close()
        fake.close()


def one_page():
    return bytes(PageBytes(pool(1, True), PAGE).gather([0]).numpy())


LIES = {
    "done without the pages": lambda f, i, r: f.send(i, "done", room=9, first=FIRST),
    "pages of the wrong size": lambda f, i, r: (
        f.send(i, "pages", b"x" * 7, room=9, count=1),
        f.send(i, "done", room=9, first=FIRST),
    ),
    "more pages than registered": lambda f, i, r: f.send(
        i, "pages", one_page() * 3, room=9, count=3
    ),
    "a first token outside the vocabulary": lambda f, i, r: (
        f.send(i, "pages", one_page() * 2, room=9, count=2),
        f.send(i, "done", room=9, first={"id": 100, "logprob": 0.0}),  # the vocabulary is 100
    ),
    "a logprob above 0": lambda f, i, r: (
        f.send(i, "pages", one_page() * 2, room=9, count=2),
        f.send(i, "done", room=9, first={"id": 1, "logprob": 3.5}),
    ),
    "top logprobs of no shape": lambda f, i, r: (
        f.send(i, "pages", one_page() * 2, room=9, count=2),
        f.send(i, "done", room=9, first={**FIRST, "top_logprobs": [[1, -0.1]] * 65}),
    ),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_prefill_server_fails_the_room_and_writes_nothing_unchecked(lie):
    events, dst = _lying_prefill(LIES[lie])
    (ev,) = events
    assert isinstance(ev, KVFailed) and "sent an invalid" in ev.error, ev
    if lie in ("done without the pages", "pages of the wrong size", "more pages than registered"):
        assert not any(t.any() for t in dst)  # nothing was copied anywhere
    untouched = [q for q in range(8) if q not in (5, 6)]
    assert all(not page(t, q).any() for t in dst for q in untouched)


def test_first_token_checks():
    assert check_first({"id": 3, "logprob": -1, "top_logprobs": [[4, -2.0]]}, 10)["id"] == 3
    for bad in (
        {"id": 2**70},
        {"id": True},
        {"id": -1},
        {"id": "3"},
        [3],
        {"id": 1, "logprob": 1e400},
    ):
        with pytest.raises(PeerError):
            check_first(bad, 10)


def test_messages_for_other_rooms_or_of_no_shape_are_ignored():
    def lie(fake, ident, reg):
        fake.sock.send_multipart([ident, b"\xff not json"])
        fake.send(ident, "pages", one_page(), room=10, count=1)  # a room never registered
        fake.send(ident, "staging", room=9, addr=12345)  # the old wire's write-anywhere
        fake.send(ident, "pages", one_page() * 2, room=9, count=2)
        fake.send(ident, "done", room=9, first=FIRST)

    (ev,) = _lying_prefill(lie)[0]
    assert isinstance(ev, KVArrived) and ev.first == FIRST  # the agent went on


def test_a_decode_server_takes_kv_only_from_configured_prefill_servers():
    d = decode_link(pool(2, False), free_port())
    try:
        d.expect(Bootstrap("10.1.2.3", 8998, 4), [0], 0)
        (ev,) = wait_events(d, timeout=2)
        assert isinstance(ev, KVFailed) and "not a configured prefill server" in ev.error
    finally:
        d.close()


def _fake_decode(port, secret=SECRET):
    ctx = zmq.Context()
    return ctx, peer_socket(ctx, secret, f"127.0.0.1:{port}", 1 << 20)


def _register(sock, room, num_pages=2, start=0, layout=None):
    layout = layout or KVLayout.of_pool(pool(1, False), PAGE).to_wire()
    msg = {"op": "register", "room": room, "layout": layout, "num_pages": num_pages, "start": start}
    sock.send(json.dumps(msg).encode())


def _answers(sock, timeout=2.0):
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.poll(100):
            out.append(orjson.loads(sock.recv_multipart()[0]))
    return out


def test_a_second_registration_cannot_take_a_rooms_kv_nor_cancel_it():
    src, dst = pool(8, True), pool(8, False)
    with linked(src, dst) as (p, d, port):
        d.expect(Bootstrap("127.0.0.1", port, 31), [0, 1], 0)
        time.sleep(0.2)
        ctx, thief = _fake_decode(port)
        try:
            _register(thief, 31)
            answers = _answers(thief)
            assert [a["op"] for a in answers] == ["failed"], answers
            assert "already registered" in answers[0]["error"]
            thief.send(orjson.dumps({"op": "cancel", "room": 31}))  # not its room: ignored
            time.sleep(0.2)
            p.send(31, [4, 5], FIRST)
            (arrived,) = wait_events(d)
            assert isinstance(arrived, KVArrived)
            assert torch.equal(page(dst[0], 0), page(src[0], 4))
            assert torch.equal(page(dst[-1], 1), page(src[-1], 5))
            assert _answers(thief, 0.5) == []
        finally:
            thief.close(linger=0)
            ctx.term()


@pytest.mark.parametrize(
    "fields",
    [
        {"num_pages": -1},
        {"start": 2**80},
        {"layout": {"page_bytes": "many"}},
        {"layout": {"page_bytes": [0]}},
        # well-formed, but not this pool's: refused at once, never kept for the room's lifetime
        # (#56.3: 65,536 rooms of 4,096-int layouts held ~10 GB for 300 s)
        {"layout": {"page_bytes": [64] * 4096}},
    ],
)
def test_a_malformed_registration_is_refused_and_the_prefill_agent_goes_on(fields):
    src = pool(8, True)
    port = free_port()
    p = prefill_link(src, port)
    ctx, peer = _fake_decode(port)
    try:
        _register(peer, 3, **fields)
        answers = _answers(peer, 1.0)
        assert [a["op"] for a in answers] == ["failed"] and "refused" in answers[0]["error"]
        peer.send(orjson.dumps({"op": "ping"}))
        assert [a["op"] for a in _answers(peer, 1.0)] == ["pong"]
    finally:
        peer.close(linger=0)
        ctx.term()
        p.close()


def test_peers_without_the_secret_are_not_heard():
    src, dst = pool(8, True), pool(8, False)
    port = free_port()
    p = prefill_link(src, port, timeout=1.0)
    ctx, outsider = _fake_decode(port, secret="not-the-pair-secret")
    raw_ctx = zmq.Context()
    raw = raw_ctx.socket(zmq.DEALER)  # no CURVE at all
    raw.connect(f"tcp://127.0.0.1:{port}")
    d = decode_link(dst, port, secret="another-wrong-secret")
    try:
        _register(outsider, 8)
        # never blocking: once its handshake has failed (the server speaks CURVE), libzmq drops the
        # DEALER's pipe for good, and a blocking send would wait forever (a loaded machine got there
        # before this line)
        with contextlib.suppress(zmq.Again):
            raw.send(orjson.dumps({"op": "register", "room": 8}), zmq.NOBLOCK)
        d.expect(Bootstrap("127.0.0.1", port, 8), [0, 1], 0)
        p.send(8, [4, 5], FIRST)
        # the room ends at the prefill side's 1 s timeout, as no registration ever reached it; the
        # wait's ceiling only bounds a hang (a loaded machine may run the agent's thread late)
        (sent,) = wait_events(p, timeout=60)
        assert isinstance(sent, KVSent) and "did not ask for the KV" in sent.error, sent
        assert _answers(outsider, 0.5) == []
        assert p.events() == []  # that one event, and no other (the room was never sent)
        assert not any(t.any() for t in dst)
    finally:
        for s in (outsider, raw):
            s.close(linger=0)
        ctx.term()
        raw_ctx.term()
        d.close()
        p.close()


def test_a_flood_of_registrations_and_cancels_is_bounded(monkeypatch):
    monkeypatch.setattr(prefill_agent, "MAX_ROOMS", 4)
    port = free_port()
    p = prefill_link(pool(8, True), port)
    ctx, peer = _fake_decode(port)
    try:
        for room in range(6):
            _register(peer, room)
        for room in range(100, 110):
            peer.send(json.dumps({"op": "cancel", "room": room}).encode())
        answers = _answers(peer, 1.5)
        refused = [a for a in answers if a["op"] == "failed"]
        assert [a["room"] for a in refused] == [4, 5] and "4 rooms" in refused[0]["error"]
        assert sum(a["op"] == "cancelled" for a in answers) == 10
        agent = p.agent
        assert len(agent.regs) == 4 and len(agent.ended) == 4  # the oldest ended rooms forgotten
        assert set(agent.ended) == {106, 107, 108, 109}
    finally:
        peer.close(linger=0)
        ctx.term()
        p.close()


def test_without_its_authenticator_the_bootstrap_port_admits_no_one():
    """#56.9: ZAP fails closed. With the authenticator's thread gone, libzmq admitted any CURVE
    client holding the server's public key unless a ZAP domain is set and enforced."""
    port = free_port()
    ctx, sock, auth = bootstrap_socket(SECRET, f"tcp://127.0.0.1:{port}")
    auth.stop()
    peer_ctx = zmq.Context()
    peer = peer_socket(peer_ctx, SECRET, f"127.0.0.1:{port}", 1 << 20)  # even the right keys
    try:
        peer.send(b"register")
        assert sock.poll(1500) == 0  # nothing delivered (it was, at once, before the fix)
    finally:
        peer.close(linger=0)
        peer_ctx.term()
        sock.close(linger=0)
        ctx.term()


def test_a_decode_server_that_never_reads_holds_a_few_chunks_not_every_rooms_kv(monkeypatch):
    """#56.3 (b): a peer that registers rooms and never reads made the prefill agent queue every
    room's KV (SNDHWM=0); now PEER_QUEUE_MESSAGES chunks wait for it, the rest waits unread in the
    pool, and the transfers fail at the timeout. Truth: how far each transfer got."""
    monkeypatch.setattr(prefill_agent, "CHUNK_BYTES", 1)  # one page a chunk
    big = [torch.randn(64 * PAGE, 64, 64) for _ in range(2)]  # 64 pages of 128 KiB
    page_bytes = PageBytes(big, PAGE).gather([0]).numel()
    port = free_port()
    transfer = ThreadTransfer(zmq.Context.instance())
    layout = KVLayout.of_pool(big, PAGE)
    bind = f"tcp://127.0.0.1:{port}"
    agent = PrefillAgent(transfer.ctx, transfer.cmd_addr, transfer.evt_addr, 3.0, layout,
                         PageBytes(big, PAGE), SECRET, bind)  # fmt: skip
    transfer.start(agent)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.RCVHWM, 1)  # its sockets queue one message and a small kernel buffer:
    ctx.setsockopt(zmq.RCVBUF, 1 << 16)  # what waits, waits on the prefill server's side
    peer = peer_socket(ctx, SECRET, f"127.0.0.1:{port}", 1 << 20)
    try:
        for room in range(4):
            _register(peer, room, num_pages=64, layout=layout.to_wire())
        time.sleep(0.3)
        for room in range(4):
            transfer.send(room, list(range(64)), FIRST)
        time.sleep(1.0)
        # nothing read: no room sent, and what the agent queued is a few chunks (plus what the
        # kernel's buffers took), not the 4 x 8 MiB it would queue without a bound
        assert transfer.events() == []
        # 4 in its queue, one in ZeroMQ's engine, the rest in the two kernels' socket buffers (this
        # machine's up to 4 MiB to send): at most 48 of the 256 chunks
        queued = sum(t["bytes"] for t in list(agent.outgoing.values()))
        assert queued <= 48 * page_bytes, (queued, page_bytes)
        events = wait_events(transfer, n=4, timeout=60)  # the 3 s timeout, then every room fails
        assert all(isinstance(e, KVSent) and "did not read" in e.error for e in events), events
        assert agent.outgoing == {}
    finally:
        peer.close(linger=0)
        ctx.term()
        transfer.close()


def test_a_transfer_of_more_chunks_than_the_queue_holds_arrives_whole(monkeypatch):
    """The bound waits for the reader; it drops nothing: 64 chunks through a queue of 4."""
    monkeypatch.setattr(prefill_agent, "CHUNK_BYTES", 1)
    src, dst = pool(64, True), pool(64, False)
    with linked(src, dst) as (p, d, port):
        d.expect(Bootstrap("127.0.0.1", port, 5), list(range(64)), 0)
        time.sleep(0.2)
        p.send(5, list(range(63, -1, -1)), FIRST)
        (arrived,) = wait_events(d)
        assert isinstance(arrived, KVArrived)
        (sent,) = wait_events(p)
        assert isinstance(sent, KVSent) and sent.error is None and sent.num_pages == 64
        assert all(torch.equal(page(dst[0], q), page(src[0], 63 - q)) for q in range(64))


def test_replies_to_a_decode_server_that_never_reads_are_bounded(monkeypatch):
    """Pings (or registrations) from a peer that never reads its answers: the replies waiting for
    it stay within MAX_WAITING_REPLIES, and the agent still answers another decode server."""
    monkeypatch.setattr(prefill_agent, "MAX_WAITING_REPLIES", 50)
    port = free_port()
    p = prefill_link(pool(8, True), port)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.RCVHWM, 1)
    ctx.setsockopt(zmq.RCVBUF, 1 << 12)
    mute = peer_socket(ctx, SECRET, f"127.0.0.1:{port}", 1 << 20)
    ctx2, other = _fake_decode(port)
    try:
        # until more pongs wait than the kernels' socket buffers take (up to 4 MiB to send here)
        most = 0
        for _ in range(10):
            for _ in range(100_000):
                mute.send(b'{"op": "ping"}')
            time.sleep(0.2)
            lengths = [len(w) for w in list(p.agent.replies.values())]
            assert all(n <= 50 for n in lengths), lengths
            most = max([most, *lengths])
            if most == 50:
                break
        assert most == 50, most  # the queue was full and replies waited, at most 50
        other.send(orjson.dumps({"op": "ping"}))
        assert [a["op"] for a in _answers(other, 2.0)] == ["pong"]
    finally:
        for sock, c in ((mute, ctx), (other, ctx2)):
            sock.close(linger=0)
            c.term()
        p.close()
