"""The seam between the scheduler and the KV transfer of prefill-decode disaggregation.

core/ decides which pages travel and when a request may use them; disaggregation/ moves the bytes
(over the pair's CURVE channel) and talks to the peer server. They meet through `KVTransfer`; what
comes back is one of the frozen events below, read with `KVTransfer.events()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from radixrt.runtime.request.options import Bootstrap


@dataclass(frozen=True)
class KVSent:
    """Prefill side: the room's pages reached the decode server (error None), or never will."""

    room: int
    error: str | None = None
    num_pages: int = 0
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class KVArrived:
    """Decode side: the room's pages are in the pages it registered; `first` is the token the
    prefill server sampled after the prompt ({"id", "logprob", "top_logprobs"})."""

    room: int
    first: dict[str, Any]
    num_pages: int = 0
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class KVFailed:
    """Decode side: the room's KV will not come; the prefill side writes nothing more into its
    pages (it said so, or it is gone), so they may be freed."""

    room: int
    error: str


class KVTransfer(Protocol):
    """What the scheduler asks of the transfer (disaggregation/transfer.py's ThreadTransfer, or a
    test's fake). Every call returns at once; outcomes come back as events."""

    def send(self, room: int, page_ids: list[int], first: dict[str, Any]) -> None:
        """Prefill: the prompt of `room` is computed in page_ids (position order, the whole prompt):
        write the pages the decode server asks for, then tell it `first`."""

    def drop(self, room: int, error: str) -> None:
        """Prefill: `room` will not be sent (aborted, refused, failed): tell its decode server."""

    def expect(self, bootstrap: Bootstrap, page_ids: list[int], start_page: int) -> None:
        """Decode: the prompt's pages from start_page on (its cached prefix is already here) go into
        page_ids: register them with the prefill server."""

    def cancel(self, bootstrap: Bootstrap) -> None:
        """Decode: the request ended here; a KVFailed (or KVArrived) still follows for a room
        expect() registered, once the prefill side no longer writes into its pages."""

    def events(self) -> list[KVSent | KVArrived | KVFailed]:
        """What happened since the last call."""

    @property
    def alive(self) -> bool:
        """False once no more events can come (the transfer stopped)."""

    def close(self) -> None: ...
