"""Checks of what a peer server sends (trust no peer, even an authenticated one: a bug or a
compromised server there must fail one room here, never this server's loop, memory or tree).

Most of them are the messages' types (wire.py: msgspec refuses a message of the wrong shape as it
decodes). These are the rest, on the decoded values: what msgspec cannot express."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from radixrt.runtime.disaggregation.wire import First, PeerError

__all__ = ["MAX_ERROR_CHARS", "MAX_ROOM", "PeerError", "check_first", "check_room", "error_text"]

MAX_ROOM = 2**64 - 1  # as the request edge takes it (request/option_checks.py)
MAX_ERROR_CHARS = 500


def check_room(room: int) -> int:
    """A decoded room (an int >= 0) within u64: msgspec bounds ints only within int64, and it
    decodes larger ones (up to Python's 4,300 digits), which would otherwise be kept as keys."""
    if room > MAX_ROOM:
        raise PeerError(f"room must be at most {MAX_ROOM}, got {str(room)[:40]}...")
    return room


def _check_logprob(v: float | None, name: str) -> None:
    # JSON has no inf or nan, but a number past a float's range (1e400) decodes as inf
    if v is not None and not (math.isfinite(v) and v <= 0):
        raise PeerError(f"{name} must be a finite log-probability (<= 0) or null, got {v!r}")


def check_first(first: First | Any, vocab_size: int) -> dict[str, Any]:
    """The prefill server's first token, its ids in the vocabulary and its log-probabilities finite
    and <= 0; returned as the dict the scheduler takes (KVArrived.first). first: a decoded First,
    or the same as builtins (a mapping: typed here first, as a message would be)."""
    if not isinstance(first, First):
        try:
            first = msgspec.convert(first, First)
        except msgspec.ValidationError as e:
            raise PeerError(f"first: {e}") from None
    if not first.id < vocab_size:
        raise PeerError(f"first.id must be below the vocabulary's {vocab_size}, got {first.id}")
    _check_logprob(first.logprob, "first.logprob")
    for i, (tid, logprob) in enumerate(first.top_logprobs or ()):
        if not tid < vocab_size:
            name = f"first.top_logprobs[{i}] id"
            raise PeerError(f"{name} must be below the vocabulary's {vocab_size}, got {tid}")
        _check_logprob(logprob, f"first.top_logprobs[{i}] logprob")
    return msgspec.to_builtins(first)


def error_text(text: str) -> str:
    """A peer's error message, cut to a bounded length (a long one is still an answer: its room
    fails with the start of it, rather than with no reason)."""
    return text[:MAX_ERROR_CHARS]
