"""Sessions: a multi-turn conversation keeps its last turn pinned in the radix tree.

A request may carry a session_id. When it finishes, its prompt + output (what has KV) is pinned
(pins.py: within the pool's pin caps) and the session's previous pin is let go, in that order, so
the part the two turns share never looks free. The next turn, whose prompt extends that text, is
then a cache hit for all of it even when other traffic has filled the pool. A session ends when it
is closed, when its pin's ttl passes without a new turn, or when MAX_SESSIONS newer sessions push it
out: the oldest of a tenant holding more than a quarter of the table first, another tenant's only
after them (#56.6: 4,096 sessions of one tenant unpinned everyone else's). Per session the table
counts turns and prompt / cached tokens (its hit rate) for /get_server_info. A session belongs to
its cache_salt (session_key): another tenant naming the same session id has a session of its own,
and cannot end or replace this one's pin.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from radixrt.runtime.core.pins import PinTable

MAX_SESSIONS = 4096
MAX_REPORTED = 64  # sessions listed in server_info (the most recently used)


SessionKey = str | tuple[str, str]


def session_key(session_id: str, cache_salt: str | None) -> SessionKey:
    """The table's key of a tenant's session: the id itself without a salt, else (id, a digest of
    the salt) - a pair, so no unsalted id can name it; listed as "id@digest" (_shown), never with
    the salt itself."""
    if cache_salt is None:
        return session_id
    return session_id, hashlib.sha256(cache_salt.encode()).hexdigest()[:16]


def _tenant(key: SessionKey) -> str:
    """Whose session it is: its salt's digest ("" unsalted)."""
    return "" if isinstance(key, str) else key[1]


def _shown(key: SessionKey) -> str:
    return key if isinstance(key, str) else "@".join(key)


@dataclass
class Session:
    handle: str | None = (
        None  # the pin holding the last turn (None: not pinned, e.g. refused by the caps)
    )
    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    pinned_tokens: int = 0


class SessionTable:
    def __init__(self, pins: PinTable, ttl_s: float):
        self.pins = pins
        self.ttl_s = ttl_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._per_tenant: dict[str, int] = {}  # sessions held per salt digest ("": unsalted)

    def __len__(self) -> int:
        return len(self._sessions)

    def on_admit(self, session_id: SessionKey, prompt_tokens: int, cached_tokens: int) -> None:
        s = self._touch(session_id)
        s.turns += 1
        s.prompt_tokens += prompt_tokens
        s.cached_tokens += cached_tokens

    def on_finish(self, session_id: SessionKey, token_ids: list[int]) -> None:
        """Pin the finished turn's tokens (those with KV), then let the previous turn's pin go."""
        s = self._touch(session_id)
        handle = self.pins.pin(token_ids, self.ttl_s) if token_ids else None
        if handle is not None or s.handle is None or self.pins.expiry(s.handle) is None:
            self._unpin(s)
            s.handle = handle
            s.pinned_tokens = len(token_ids) if handle is not None else 0
        # refused (over the caps) with an older pin alive: the older turn stays pinned; it is still
        # a prefix of what comes next

    def close(self, session_id: SessionKey) -> bool:
        s = self._pop(session_id)
        if s is None:
            return False
        self._unpin(s)
        return True

    def expire(self) -> None:
        """Forget sessions whose pin is gone (lapsed, or let go for memory); the scheduler calls
        this only when pins went away, so it is not per-step work."""
        for sid in [
            sid
            for sid, s in self._sessions.items()
            if s.handle is not None and self.pins.expiry(s.handle) is None
        ]:
            self._pop(sid)

    def owners(self) -> dict[str, str]:
        """pin handle -> the session holding it."""
        return {s.handle: _shown(sid) for sid, s in self._sessions.items() if s.handle is not None}

    def clear(self) -> None:
        for sid in list(self._sessions):
            self.close(sid)

    def info(self) -> dict:
        recent = list(self._sessions.items())[-MAX_REPORTED:][::-1]
        return {
            "num_sessions": len(self._sessions),
            "sessions": {
                _shown(sid): {
                    "turns": s.turns,
                    "prompt_tokens": s.prompt_tokens,
                    "cached_tokens": s.cached_tokens,
                    "pinned_tokens": s.pinned_tokens,
                    "hit_rate": s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
                }
                for sid, s in recent
            },
        }

    def _touch(self, session_id: SessionKey) -> Session:
        s = self._pop(session_id) or Session()
        self._sessions[session_id] = s  # most recently used last
        tenant = _tenant(session_id)
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        if len(self._sessions) > MAX_SESSIONS:
            share = MAX_SESSIONS // 4
            victim = next(
                (k for k in self._sessions if self._per_tenant[_tenant(k)] > share),
                next(iter(self._sessions)),
            )
            self._unpin(self._pop(victim))
        return s

    def _pop(self, session_id: SessionKey) -> Session | None:
        s = self._sessions.pop(session_id, None)
        if s is not None:
            tenant = _tenant(session_id)
            self._per_tenant[tenant] -= 1
            if not self._per_tenant[tenant]:
                del self._per_tenant[tenant]
        return s

    def _unpin(self, s: Session) -> None:
        if s.handle is not None:
            self.pins.unpin(s.handle)
            s.handle, s.pinned_tokens = None, 0
