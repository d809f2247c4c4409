"""#56.6: a tenant that opens sessions past a quarter of the table pushes out its own oldest, not
another tenant's (4,096 sessions of one tenant used to unpin everyone else's). Truth: a naive pin
table that records what is pinned and unpinned."""

from __future__ import annotations

import itertools

from radixrt.runtime.core import sessions
from radixrt.runtime.core.sessions import SessionTable, session_key


class NaivePins:
    def __init__(self):
        self.live: dict[str, list[int]] = {}
        self._ids = itertools.count()

    def pin(self, token_ids, ttl_s):
        handle = f"h{next(self._ids)}"
        self.live[handle] = list(token_ids)
        return handle

    def unpin(self, handle):
        self.live.pop(handle, None)

    def expiry(self, handle):
        return 1.0 if handle in self.live else None


def turn(table, sid, salt):
    key = session_key(sid, salt)
    table.on_admit(key, 4, 0)
    table.on_finish(key, [1, 2, 3, 4])


def test_a_flooding_tenant_unpins_only_its_own(monkeypatch):
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 40)
    pins = NaivePins()
    table = SessionTable(pins, ttl_s=60)
    for i in range(10):
        turn(table, f"victim-{i}", "salt-a")
    for i in range(5):
        turn(table, f"plain-{i}", None)
    for i in range(4096):
        turn(table, f"flood-{i}", "salt-b")
    held = table.owners().values()
    assert sum(s.startswith("victim-") for s in held) == 10
    assert sum(s.startswith("plain-") for s in held) == 5
    assert len(table) == 40 and len(pins.live) == 40  # nothing left pinned without its session
    flood = sorted(int(s.split("@")[0].split("-")[1]) for s in held if s.startswith("flood-"))
    assert flood == list(range(4096 - 25, 4096))  # the flood keeps its newest
    assert all(v for v in table._per_tenant.values()) and sum(table._per_tenant.values()) == 40


def test_a_lone_tenant_still_fills_the_table(monkeypatch):
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 40)
    table = SessionTable(NaivePins(), ttl_s=60)
    for i in range(100):
        turn(table, f"s{i}", None)
    assert len(table) == 40
    assert table.close(session_key("s99", None)) and len(table) == 39
    assert table._per_tenant == {"": 39}
