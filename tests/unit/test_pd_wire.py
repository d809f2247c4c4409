"""The PD pair's messages as typed structs (disaggregation/wire.py): every message keeps the JSON shape
the peers exchanged before they were typed (the literal dicts below) and survives a round trip; a
message of the wrong shape (a field of the wrong type, an unknown field or op, an int out of its
bounds, a list too long) is refused with msgspec's text naming the field, and over real sockets it
fails its room alone (or is dropped) while both agents go on serving.
"""

import json

import orjson
import pytest
from test_pd_agents import FIRST, decode_link, page, pool, prefill_link, wait_events
from test_pd_hostile_peers import FakePrefill, _answers, _fake_decode, one_page

from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation import wire
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.peer_checks import MAX_ROOM, PeerError, check_room
from radixrt.runtime.processes import free_port
from radixrt.runtime.request.options import Bootstrap

LAYOUT = KVLayout(page_bytes=(96, 96, 12))
TOKEN = wire.First(id=17, logprob=-0.5, top_logprobs=[(3, -1.25), (4, None)])
TOKEN_JSON = {"id": 17, "logprob": -0.5, "top_logprobs": [[3, -1.25], [4, None]]}

# (message, the JSON object it is on the wire, the decoder of the side that receives it)
MESSAGES = [
    (
        wire.Register(room=MAX_ROOM, layout=LAYOUT, num_pages=3, start=2),
        {
            "op": "register",
            "room": MAX_ROOM,
            "layout": {"page_bytes": [96, 96, 12]},
            "num_pages": 3,
            "start": 2,
        },
        wire.FROM_DECODE,
    ),
    (wire.Cancel(room=7), {"op": "cancel", "room": 7}, wire.FROM_DECODE),
    (wire.Ping(), {"op": "ping"}, wire.FROM_DECODE),
    (wire.Pages(room=7, count=4), {"op": "pages", "room": 7, "count": 4}, wire.FROM_PREFILL),
    (
        wire.Done(room=7, first=TOKEN, num_pages=4, num_bytes=816),
        {"op": "done", "room": 7, "first": TOKEN_JSON, "num_pages": 4, "num_bytes": 816},
        wire.FROM_PREFILL,
    ),
    (
        wire.Failed(room=7, error="no"),
        {"op": "failed", "room": 7, "error": "no"},
        wire.FROM_PREFILL,
    ),
    (wire.Cancelled(room=7), {"op": "cancelled", "room": 7}, wire.FROM_PREFILL),
    (wire.Pong(), {"op": "pong"}, wire.FROM_PREFILL),
    (
        wire.SendCommand(room=7, pages=[3, 1], first=TOKEN),
        {"op": "send", "room": 7, "pages": [3, 1], "first": TOKEN_JSON},
        wire.PREFILL_COMMANDS,
    ),
    (
        wire.DropCommand(room=7, error="x"),
        {"op": "drop", "room": 7, "error": "x"},
        wire.PREFILL_COMMANDS,
    ),
    (wire.CloseCommand(), {"op": "close"}, wire.PREFILL_COMMANDS),
    (
        wire.ExpectCommand(room=7, addr="h:1", pages=[2], start=1),
        {"op": "expect", "room": 7, "addr": "h:1", "pages": [2], "start": 1},
        wire.DECODE_COMMANDS,
    ),
    (
        wire.CancelCommand(room=7, addr="h:1"),
        {"op": "cancel", "room": 7, "addr": "h:1"},
        wire.DECODE_COMMANDS,
    ),
    (
        wire.SentEvent(room=7, error=None, num_pages=2, num_bytes=9, seconds=0.5),
        {"kind": "sent", "room": 7, "error": None, "num_pages": 2, "num_bytes": 9, "seconds": 0.5},
        wire.EVENTS,
    ),
    (
        wire.ArrivedEvent(room=7, first=TOKEN, num_pages=2, num_bytes=9, seconds=0.5),
        {
            "kind": "arrived",
            "room": 7,
            "first": TOKEN_JSON,
            "num_pages": 2,
            "num_bytes": 9,
            "seconds": 0.5,
        },
        wire.EVENTS,
    ),
    (wire.FailedEvent(room=7, error="x"), {"kind": "failed", "room": 7, "error": "x"}, wire.EVENTS),
]


@pytest.mark.parametrize("msg,shape,decoder", MESSAGES, ids=[type(m[0]).__name__ for m in MESSAGES])
def test_every_message_keeps_its_json_shape_and_round_trips(msg, shape, decoder):
    data = wire.encode(msg)
    assert orjson.loads(data) == shape
    assert decoder.decode(data) == msg
    assert decoder.decode(json.dumps(shape).encode()) == msg  # as a peer built by hand sends it


def test_events_become_the_schedulers_own():
    arrived = wire.EVENTS.decode(wire.encode(wire.ArrivedEvent(room=7, first=TOKEN, num_pages=2)))
    assert arrived.core() == KVArrived(7, handed_over(TOKEN_JSON), num_pages=2)
    assert wire.FailedEvent(room=3, error="e").core() == KVFailed(3, "e")
    assert wire.SentEvent(room=3, num_bytes=5).core() == KVSent(3, num_bytes=5)


def handed_over(d):
    """KVArrived.first as the decode side hands it over: the pairs as tuples (the scheduler reads
    each pair by position)."""
    return {**d, "top_logprobs": [tuple(p) for p in d["top_logprobs"]]}


REG = {"op": "register", "room": 3, "layout": {"page_bytes": [64]}, "num_pages": 2, "start": 0}
DONE = {"op": "done", "room": 9, "first": FIRST}

# (the side's decoder, the message, text the error holds, its op's struct (None: not one this side
# takes), its room (None: unreadable))
REFUSED = [
    (wire.FROM_DECODE, {**REG, "num_pages": "2"}, "`$.num_pages`", wire.Register, 3),
    (
        wire.FROM_DECODE,
        {**REG, "start": 1 << 24 | 1},
        "<= 16777216 - at `$.start`",
        wire.Register,
        3,
    ),
    (wire.FROM_DECODE, {**REG, "session": "s"}, "unknown field `session`", wire.Register, 3),
    (
        wire.FROM_DECODE,
        {**REG, "layout": {"page_bytes": [64] * 4097}},
        "length <= 4096 - at `$.layout.page_bytes`",
        wire.Register,
        3,
    ),
    (
        wire.FROM_DECODE,
        {**REG, "layout": {"page_bytes": [64, 0]}},
        "`$.layout.page_bytes[1]`",
        wire.Register,
        3,
    ),
    (wire.FROM_DECODE, {"op": "cancel", "room": True}, "`$.room`", None, None),
    (wire.FROM_DECODE, {"op": "cancel", "room": -1}, ">= 0 - at `$.room`", None, None),
    (wire.FROM_DECODE, {"op": "staging", "room": 9, "addr": 1}, "'staging' - at `$.op`", None, 9),
    # an op of the other direction: not one this side takes
    (wire.FROM_DECODE, {"op": "pages", "room": 9, "count": 1}, "'pages' - at `$.op`", None, 9),
    (wire.FROM_DECODE, {"room": 9}, "missing required field `op`", None, None),
    (
        wire.FROM_PREFILL,
        {"op": "pages", "room": 9, "count": 0},
        ">= 1 - at `$.count`",
        wire.Pages,
        9,
    ),
    (wire.FROM_PREFILL, {**DONE, "first": {"id": "17"}}, "`$.first.id`", wire.Done, 9),
    (
        wire.FROM_PREFILL,
        {**DONE, "first": {**FIRST, "top_logprobs": [[1, -0.1]] * 65}},
        "length <= 64 - at `$.first.top_logprobs`",
        wire.Done,
        9,
    ),
    (
        wire.FROM_PREFILL,
        {**DONE, "first": {**FIRST, "top_logprobs": [[1, -0.1, 2]]}},
        "`$.first.top_logprobs[0]`",
        wire.Done,
        9,
    ),
    (wire.FROM_PREFILL, {"op": "failed", "room": 9, "error": 5}, "`$.error`", wire.Failed, 9),
    (wire.FROM_PREFILL, {"op": "pong", "at": 1}, "unknown field `at`", wire.Pong, None),
    (wire.FROM_PREFILL, [1, 2], "Expected `object`", None, None),
]


@pytest.mark.parametrize("decoder,msg,text,kind,room", REFUSED)
def test_a_message_of_the_wrong_shape_is_refused_naming_the_field(decoder, msg, text, kind, room):
    with pytest.raises(PeerError) as e:
        decoder.decode(json.dumps(msg).encode())
    assert isinstance(e.value, wire.BadMessage) and text in str(e.value), str(e.value)
    assert (e.value.kind, e.value.room) == (kind, room)


def test_what_is_not_json_is_refused_and_pinned_on_nothing():
    with pytest.raises(wire.BadMessage, match="malformed") as e:
        wire.FROM_PREFILL.decode(b"\xff not json")
    assert (e.value.kind, e.value.room) == (None, None)


def test_a_room_past_u64_decodes_but_is_refused_by_check_room():
    """msgspec bounds ints only within int64, so the u64 bound is peer_checks'."""
    msg = wire.FROM_DECODE.decode(json.dumps({"op": "cancel", "room": MAX_ROOM + 1}).encode())
    assert check_room(MAX_ROOM) == MAX_ROOM
    with pytest.raises(PeerError, match="room must be at most"):
        check_room(msg.room)


@pytest.mark.parametrize(
    "fields,text",
    [
        ({"num_pages": "2"}, "`$.num_pages`"),
        ({"session": "s"}, "unknown field `session`"),
        ({"layout": {"page_bytes": [64] * 4097}}, "`$.layout.page_bytes`"),
    ],
)
def test_a_registration_of_the_wrong_shape_is_refused_by_field_and_the_prefill_agent_goes_on(
    fields, text
):
    port = free_port()
    p = prefill_link(pool(8, True), port)
    ctx, peer = _fake_decode(port)
    try:
        layout = KVLayout.of_pool(pool(1, False), 4).to_wire()
        reg = {"op": "register", "room": 3, "layout": layout, "num_pages": 2, "start": 0}
        peer.send(json.dumps({**reg, **fields}).encode())
        (answer,) = _answers(peer, 1.0)
        assert answer["op"] == "failed" and answer["room"] == 3, answer
        assert "registration refused" in answer["error"] and text in answer["error"], answer
        # neither a message of an unknown op nor one whose room is out of range is answered
        for bad in (
            {"op": "staging", "room": 4},
            {"op": "cancel", "room": 2**64},
            {"op": "cancel", "room": -1},
        ):
            peer.send(json.dumps(bad).encode())
        peer.send(orjson.dumps({"op": "ping"}))
        assert [a["op"] for a in _answers(peer, 1.0)] == ["pong"]
    finally:
        peer.close(linger=0)
        ctx.term()
        p.close()


LIES = {
    "a count that is not an int": ("pages", {"count": "2"}, "`$.count`"),
    "a first token id that is not an int": (
        "done",
        {"first": {**FIRST, "id": "17"}},
        "`$.first.id`",
    ),
    "an unknown field": ("done", {"first": FIRST, "staging": 1}, "unknown field `staging`"),
    "an error that is not text": ("failed", {"error": 5}, "`$.error`"),
    "too many top logprobs": (
        "done",
        {"first": {**FIRST, "top_logprobs": [[1, -0.1]] * 65}},
        "`$.first.top_logprobs`",
    ),
}


@pytest.mark.parametrize("lie", list(LIES))
def test_a_prefill_message_of_the_wrong_shape_fails_its_room_by_field_and_the_decode_agent_goes_on(
    lie,
):
    op, fields, text = LIES[lie]
    port, dst = free_port(), pool(8, False)
    fake, d = FakePrefill(port), decode_link(dst, port)
    try:
        d.expect(Bootstrap("127.0.0.1", port, 9), [5, 6], 0)
        d.expect(Bootstrap("127.0.0.1", port, 10), [1, 2], 0)
        ident, _ = fake.registration()
        fake.registration()
        fake.send(ident, op, *([one_page() * 2] if op == "pages" else []), room=9, **fields)
        fake.send(ident, "pages", one_page() * 2, room=10, count=2)  # the other room goes on
        fake.send(ident, "done", room=10, first=FIRST)
        failed, arrived = sorted(wait_events(d, n=2), key=lambda ev: ev.room)
        assert isinstance(failed, KVFailed) and failed.room == 9, failed
        assert f"sent an invalid {op!r}" in failed.error and text in failed.error, failed.error
        assert isinstance(arrived, KVArrived) and arrived.room == 10 and arrived.first == FIRST
        assert all(not page(t, q).any() for t in dst for q in (5, 6))  # room 9 took no bytes
    finally:
        d.close()
        fake.close()
