"""Prefixes a program keeps pinned in the radix cache (a fork's shared prefix until join).

A pin is a lock on a tree path that outlives the request that computed it. It expires
after its ttl so a client that dies cannot hold memory forever, the table refuses pins
past a share of the pool, and when a request cannot run for want of memory the scheduler
lets pins go, oldest first (drop_oldest): a pin is a cache hint, never a reason to wait.
"""

from __future__ import annotations

import secrets
import time

from radixrt.runtime.core.radix_cache import RadixCache

MAX_PINNED_FRACTION = 0.5  # of the pool, all pins together
MAX_PIN_FRACTION = 0.25  # of the pool, one pin: one client cannot take the whole pinned share
MAX_PIN_TTL_S = 3600.0  # a pin outlives its client by at most this long


class PinTable:
    def __init__(self, tree: RadixCache, pool_tokens: int):
        self.tree = tree
        self.max_pinned_tokens = int(pool_tokens * MAX_PINNED_FRACTION)
        self.max_pin_tokens = int(pool_tokens * MAX_PIN_FRACTION)
        self._pins: dict[str, tuple[object, float, int]] = {}  # handle -> (node, expiry, tokens)
        self._soonest = float(
            "inf"
        )  # no pin lapses before this (time.monotonic()); may be stale-early

    @property
    def num_pinned_tokens(self) -> int:
        return sum(n for _, _, n in self._pins.values())

    def __len__(self) -> int:
        return len(self._pins)

    def pin(self, token_ids: list[int], ttl_s: float) -> str | None:
        """Lock the cached whole-page prefix of token_ids; its handle (unguessable: whoever holds it
        can unpin), or None when refused (too large, or past the pool's pinned share)."""
        if self.tree.disable:
            return None
        pages, node = self.tree.match_prefix(token_ids)
        num_tokens = len(pages) * self.tree.page_size
        if (
            not 0 < num_tokens <= self.max_pin_tokens
            or self.num_pinned_tokens + num_tokens > self.max_pinned_tokens
        ):
            return None
        self.tree.inc_lock_ref(node)
        handle = secrets.token_urlsafe(16)
        expiry = time.monotonic() + min(ttl_s, MAX_PIN_TTL_S)
        self._pins[handle] = (node, expiry, num_tokens)
        self._soonest = min(self._soonest, expiry)
        return handle

    def expiry(self, handle: str) -> float | None:
        """time.monotonic() at which the pin lapses (None: no such pin)."""
        entry = self._pins.get(handle)
        return None if entry is None else entry[1]

    def unpin(self, handle: str) -> bool:
        entry = self._pins.pop(handle, None)
        if entry is None:
            return False
        self.tree.dec_lock_ref(entry[0])
        return True

    def expire(self) -> int:
        """Unpin what lapsed; how many. Called every step: O(1) until the soonest expiry passes."""
        now = time.monotonic()
        if not self._pins or now < self._soonest:
            return 0
        lapsed = [h for h, (_, expiry, _) in self._pins.items() if expiry <= now]
        for handle in lapsed:
            self.unpin(handle)
        self._soonest = min((expiry for _, expiry, _ in self._pins.values()), default=float("inf"))
        return len(lapsed)

    def drop_oldest(self) -> bool:
        """Let the oldest pin go (memory is needed for a request that cannot run otherwise)."""
        if not self._pins:
            return False
        return self.unpin(next(iter(self._pins)))

    def pinned_nodes(self) -> list[tuple[object, str]]:
        """(last node of the pinned path, handle) of every pin."""
        return [(node, handle) for handle, (node, _, _) in self._pins.items()]

    def clear(self) -> None:
        for handle in list(self._pins):
            self.unpin(handle)
