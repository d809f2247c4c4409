"""Prefixes a program keeps pinned in the radix cache (a fork's shared prefix until join).

A pin is a lock on a tree path that outlives the request that computed it. It expires
after its ttl so a client that dies cannot hold memory forever, and the table refuses
pins past a share of the pool so pins can never starve running requests.
"""
from __future__ import annotations

import time

from radixrt.runtime.core.radix_cache import RadixCache

MAX_PINNED_FRACTION = 0.5


class PinTable:
    def __init__(self, tree: RadixCache, pool_tokens: int):
        self.tree = tree
        self.max_pinned_tokens = int(pool_tokens * MAX_PINNED_FRACTION)
        self._pins: dict[str, tuple[object, float, int]] = {}  # handle -> (node, expiry, tokens)

    @property
    def num_pinned_tokens(self) -> int:
        return sum(n for _, _, n in self._pins.values())

    def __len__(self) -> int:
        return len(self._pins)

    def pin(self, handle: str, token_ids: list[int], ttl_s: float) -> bool:
        """Lock the cached whole-page prefix of token_ids; False when refused."""
        if self.tree.disable or handle in self._pins:
            return False
        pages, node = self.tree.match_prefix(token_ids)
        num_tokens = len(pages) * self.tree.page_size
        if num_tokens == 0 or self.num_pinned_tokens + num_tokens > self.max_pinned_tokens:
            return False
        self.tree.inc_lock_ref(node)
        self._pins[handle] = (node, time.monotonic() + ttl_s, num_tokens)
        return True

    def unpin(self, handle: str) -> bool:
        entry = self._pins.pop(handle, None)
        if entry is None:
            return False
        self.tree.dec_lock_ref(entry[0])
        return True

    def expire(self) -> None:
        if not self._pins:
            return
        now = time.monotonic()
        for handle in [h for h, (_, expiry, _) in self._pins.items() if expiry <= now]:
            self.unpin(handle)

    def clear(self) -> None:
        for handle in list(self._pins):
            self.unpin(handle)
