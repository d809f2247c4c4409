"""Checks of what a peer server sends (trust no peer, even an authenticated one: a bug or a
compromised server there must fail one room here, never this server's loop, memory or tree)."""

from __future__ import annotations

import math
from typing import Any

import orjson

MAX_ROOM = 2**64 - 1
MAX_TOP_LOGPROBS = 64
MAX_ERROR_CHARS = 500


class PeerError(ValueError):
    """A message from the peer server that cannot be taken."""


def check_int(v: Any, name: str, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise PeerError(f"{name} must be an integer in [{lo}, {hi}], got {str(v)[:40]!r}")
    return v


def check_room(v: Any) -> int:
    return check_int(v, "room", 0, MAX_ROOM)


def _logprob(v: Any, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v > 0:
        raise PeerError(f"{name} must be a finite log-probability (<= 0) or null")
    return float(v)


def check_first(first: Any, vocab_size: int) -> dict[str, Any]:
    """The prefill server's first token: {"id", "logprob", "top_logprobs"}, ids in vocabulary."""
    if not isinstance(first, dict):
        raise PeerError("first must be an object")
    top = first.get("top_logprobs")
    if top is not None and (not isinstance(top, list) or len(top) > MAX_TOP_LOGPROBS):
        raise PeerError(f"first.top_logprobs must be a list of at most {MAX_TOP_LOGPROBS} pairs")
    pairs = []
    for pair in top or []:
        if not isinstance(pair, list) or len(pair) != 2:
            raise PeerError("first.top_logprobs must hold [id, logprob] pairs")
        pairs.append(
            [
                check_int(pair[0], "first.top_logprobs id", 0, vocab_size - 1),
                _logprob(pair[1], "first.top_logprobs logprob"),
            ]
        )
    return {
        "id": check_int(first.get("id"), "first.id", 0, vocab_size - 1),
        "logprob": _logprob(first.get("logprob"), "first.logprob"),
        "top_logprobs": pairs if top is not None else None,
    }


def error_text(v: Any) -> str:
    """A peer's error message, as text of bounded length."""
    return (v if isinstance(v, str) else repr(v))[:MAX_ERROR_CHARS]


def header(frame: Any) -> dict[str, Any]:
    """A wire message's JSON header: an object with a string "op"."""
    try:
        msg = orjson.loads(frame.bytes if hasattr(frame, "bytes") else frame)
    except orjson.JSONDecodeError:
        raise PeerError("a message that is not JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise PeerError('a message must be an object with a string "op"')
    return msg
