"""Stored responses (`store: true`, the default): what GET /v1/responses/{id}, the cancel route and
`previous_response_id` read. In memory, bounded by count and bytes (least recently used first out)
and by time since last use.

A stored response is its owner's: the same cache_salt and, when the server checks an API key, the
same key (the tenant of http/tenants.py: the salt is the trust domain the KV is split by, the
key what a gateway presents). Anyone else is told it does not exist (404), although ids are 192
random bits. When the store is full, the oldest of the owners holding more than a quarter of it
(count or bytes) go first, and another owner's only after them (#56.6: 1,024 cheap responses of one
tenant pushed out everyone else's); a lone tenant may still fill it. A background response still
running is never evicted (the server's in-flight caps bound how many run); its task is cancelled
only when it expires unused.

What a continuation needs is kept with the answer: the conversation as chat messages (the inputs
through this answer's output, without instructions), the rendered prompt text, and the exact token
ids of the last request (its prompt and output), so the next prompt starts with those very ids and
the radix cache serves all of them (openai_responses.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_STORED_RESPONSES = 1024
MAX_STORED_BYTES = 64 << 20
STORED_TTL_S = 3600.0  # since last use


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def owner_of(request: Any, config: Any, cache_salt: str | None) -> str:
    """The tenant a response belongs to: digests of its salt and (with --api-key) its key."""
    salt = "" if cache_salt is None else _digest(cache_salt)
    auth = request.headers.get("authorization", "") if config.api_key is not None else ""
    return salt + "|" + (_digest(auth) if auth else "")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


@dataclass
class StoredResponse:
    owner: str
    response: dict[str, Any]  # the Response object as last answered
    conversation: list[dict[str, Any]] = field(default_factory=list)
    prompt_text: str = ""
    transcript_ids: array = field(default_factory=lambda: array("i"))
    tail_text: str = ""  # the output's last tokens, special tokens included
    task: Any = None  # a background response's asyncio task while it runs
    size: int = 0
    used: float = field(default_factory=time.monotonic)

    @property
    def running(self) -> bool:
        return self.response.get("status") in ("queued", "in_progress")

    def measure(self) -> int:
        self.size = (
            len(orjson.dumps(self.response))
            + len(orjson.dumps(self.conversation))
            + len(self.prompt_text.encode("utf-8", "replace"))
            + len(self.tail_text)
            + self.transcript_ids.itemsize * len(self.transcript_ids)
        )
        return self.size


class ResponsesStore:
    def __init__(
        self,
        max_entries: int = MAX_STORED_RESPONSES,
        max_bytes: int = MAX_STORED_BYTES,
        ttl_s: float = STORED_TTL_S,
    ):
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        # one owner's share of either bound, past which its entries go first
        self.owner_entries, self.owner_bytes = max(1, max_entries // 4), max(1, max_bytes // 4)
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._owned: dict[str, list[int]] = {}  # owner -> [entries, bytes]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The entry, if it exists, has not expired and is owner's (else None: a 404)."""
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or not hmac.compare_digest(entry.owner, owner):
            return None
        entry.used = time.monotonic()
        self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: StoredResponse, only_if_present: bool = False) -> None:
        """Add or replace (a background response's answer), then evict down to the bounds.
        only_if_present: replace only (a background response evicted while it ran stays out)."""
        if only_if_present and response_id not in self._entries:
            return
        if response_id in self._entries:
            self._drop(response_id, cancel=False)
        entry.used = time.monotonic()
        entry.measure()
        self._entries[response_id] = entry
        self._count(entry, 1)
        self._expire()
        # over the bounds: first the oldest of owners holding more than their share, then anyone's
        self._evict(self._over_share)
        self._evict(lambda owner: True)

    def _over_share(self, owner: str) -> bool:
        owned = self._owned.get(owner, (0, 0))
        return owned[0] > self.owner_entries or owned[1] > self.owner_bytes

    def _evict(self, may_go: Any) -> None:
        """Drop the least recently used entries that are not running and whose owner may_go(owner),
        while the store is over a bound; one pass over it."""
        for rid in list(self._entries):
            if len(self._entries) <= self.max_entries and self._bytes <= self.max_bytes:
                return
            entry = self._entries[rid]
            if not entry.running and may_go(entry.owner):
                self._drop(rid)

    def _count(self, entry: StoredResponse, sign: int) -> None:
        owned = self._owned.setdefault(entry.owner, [0, 0])
        owned[0] += sign
        owned[1] += sign * entry.size
        self._bytes += sign * entry.size
        if owned[0] == 0:
            del self._owned[entry.owner]

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.used >= cutoff:
                return
            self._drop(oldest_id)

    def _drop(self, response_id: str, cancel: bool = True) -> None:
        entry = self._entries.pop(response_id)
        self._count(entry, -1)
        if cancel and entry.task is not None and not entry.task.done():
            entry.task.cancel()  # a background response nobody can reach any more
