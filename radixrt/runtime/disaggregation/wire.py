"""The messages of prefill-decode disaggregation, declared once as msgspec Structs: between the two
servers (the peer sockets: agent.py lists them) and, inside one server, between the scheduler and
its agent thread (the inproc command and event sockets: transfer.py, agent.py).

On the wire each message is a JSON object whose "op" names it (the tag), then its fields:
`{"op": "cancel", "room": 7}`. Each side decodes what it may receive with one msgspec Decoder over
the union of those messages, so a wrong type, a missing or unknown field, an op it does not take,
an int out of its bounds or a list too long is refused as the message decodes, with msgspec's text
naming the field (`... - at $.layout.page_bytes[0]`). What no type can say (a token id within the
vocabulary, a finite log-probability, two layouts equal, the room's u64 bound) is checked on the
decoded values (peer_checks.py, KVLayout.check_same).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec
from msgspec import Meta, Struct

from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation.kv_layout import KVLayout

MAX_PAGES = 1 << 24  # pages of one room, far above any pool
MAX_TOP_LOGPROBS = 64  # above the request's own bound (sampling_params.MAX_TOP_LOGPROBS)


class PeerError(ValueError):
    """A message from the peer server that cannot be taken."""


class BadMessage(PeerError):
    """A peer message that did not decode, with what it can still be pinned on: kind, the message
    type its "op" names (None for an op this side does not take), and its room (None without one),
    so that a known message with a wrong field fails its room while anything else is dropped."""

    def __init__(self, text: str, kind: type[Struct] | None, room: int | None):
        super().__init__(text)
        self.kind, self.room = kind, room


# msgspec bounds ints only within int64, so a room's upper bound (u64, as the request edge takes
# it) is peer_checks.check_room's; a token id's is the vocabulary's (peer_checks.check_first)
Room = Annotated[int, Meta(ge=0)]
TokenId = Annotated[int, Meta(ge=0)]
NumPages = Annotated[int, Meta(ge=0, le=MAX_PAGES)]


class First(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The token the prefill server sampled after the prompt. The log-probabilities' bounds are
    checked where they come from a peer (peer_checks.check_first), not in the type: the same
    Struct carries the scheduler's own first token to its agent, which must never be refused."""

    id: TokenId
    logprob: float | None = None
    top_logprobs: (
        Annotated[list[tuple[TokenId, float | None]], Meta(max_length=MAX_TOP_LOGPROBS)] | None
    ) = None


class PeerMessage(Struct, tag_field="op", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Between the two servers. A peer is trusted with nothing, so a field this side does not know
    refuses the message instead of being skipped."""


# decode -> prefill (the prefill server's bootstrap port)
class Register(PeerMessage, tag="register"):
    room: Room
    layout: KVLayout
    num_pages: NumPages
    start: NumPages


class Cancel(PeerMessage, tag="cancel"):
    room: Room


class Ping(PeerMessage, tag="ping"):
    pass


# prefill -> decode
class Pages(PeerMessage, tag="pages"):
    """Followed by a frame of `count` whole pages' bytes."""

    room: Room
    count: Annotated[int, Meta(ge=1, le=MAX_PAGES)]


class Done(PeerMessage, tag="done"):
    """The prefill side's own count of what it sent rides along for its logs only (the decode side
    counts what came), so it may be left out."""

    room: Room
    first: First
    num_pages: NumPages = 0
    num_bytes: Annotated[int, Meta(ge=0)] = 0


class Failed(PeerMessage, tag="failed"):
    room: Room
    error: str  # cut to peer_checks.MAX_ERROR_CHARS when read: a long one is still an answer


class Cancelled(PeerMessage, tag="cancelled"):
    room: Room


class Pong(PeerMessage, tag="pong"):
    pass


def op_of(msg: Struct | type[Struct]) -> str:
    """The "op" (or "kind") that names a message on the wire: its tag."""
    return (msg if isinstance(msg, type) else type(msg)).__struct_config__.tag


class _Envelope(Struct):
    """What a refused message is about: its op and room, read leniently (any other field)."""

    op: str
    room: Room | None = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


class Inbox:
    """What one side's peer socket takes: one msgspec Decoder over the union of those messages."""

    def __init__(self, *kinds: type[PeerMessage]):
        self.kinds = {op_of(k): k for k in kinds}
        self._decoder = msgspec.json.Decoder(Union[kinds])

    def decode(self, data: Any) -> PeerMessage:
        """data: a frame's bytes (any buffer). BadMessage (a PeerError) for one this side cannot
        take, its text msgspec's, which names the field."""
        try:
            return self._decoder.decode(data)
        except msgspec.DecodeError as e:  # ValidationError included: not JSON, or not a message
            try:
                envelope = _ENVELOPE.decode(data)
            except msgspec.DecodeError:
                raise BadMessage(str(e), None, None) from None
            raise BadMessage(str(e), self.kinds.get(envelope.op), envelope.room) from None


FROM_DECODE = Inbox(Register, Cancel, Ping)  # the prefill agent's
FROM_PREFILL = Inbox(Pages, Done, Failed, Cancelled, Pong)  # the decode agent's


class Command(Struct, tag_field="op", kw_only=True, frozen=True):
    """Scheduler -> its agent thread (transfer.py -> agent.py). The process's own, so neither
    bounded nor strict: a bad one is a bug here, which the agent logs, not a peer to refuse."""


class SendCommand(Command, tag="send"):
    room: int
    pages: list[int]
    first: First


class DropCommand(Command, tag="drop"):
    room: int
    error: str


class ExpectCommand(Command, tag="expect"):
    room: int
    addr: str
    pages: list[int]
    start: int


class CancelCommand(Command, tag="cancel"):
    room: int
    addr: str


class CloseCommand(Command, tag="close"):
    pass


PREFILL_COMMANDS = msgspec.json.Decoder(SendCommand | DropCommand | CloseCommand)
DECODE_COMMANDS = msgspec.json.Decoder(ExpectCommand | CancelCommand | CloseCommand)


class Event(Struct, tag_field="kind", kw_only=True, frozen=True):
    """Agent thread -> its scheduler (agent.py -> transfer.py); core() is the scheduler's event."""


class SentEvent(Event, tag="sent"):
    room: int
    error: str | None = None
    num_pages: int = 0
    num_bytes: int = 0
    seconds: float = 0.0

    def core(self) -> KVSent:
        return KVSent(**msgspec.structs.asdict(self))


class ArrivedEvent(Event, tag="arrived"):
    room: int
    first: First
    num_pages: int = 0
    num_bytes: int = 0
    seconds: float = 0.0

    def core(self) -> KVArrived:
        # the scheduler takes the first token as the dict it built ({"id", "logprob", ...})
        fields = {**msgspec.structs.asdict(self), "first": msgspec.to_builtins(self.first)}
        return KVArrived(**fields)


class FailedEvent(Event, tag="failed"):
    room: int
    error: str

    def core(self) -> KVFailed:
        return KVFailed(**msgspec.structs.asdict(self))


EVENTS = msgspec.json.Decoder(SentEvent | ArrivedEvent | FailedEvent)

# msgspec's Encoder and Decoder are thread-safe (0.16 on): the scheduler and the agent share these
encode = msgspec.json.Encoder().encode
