"""The radix tree's namespaces: KV is shared only between requests of the same LoRA adapter and
the same cache_salt (vLLM's request field: a tenant, a trust domain).

The tree knows nothing of adapters or tenants: a request's tree keys are its tokens plus its
namespace's offset (Req.tree_ids), a multiple of KEY_STRIDE (above any vocabulary), so identical
prompts in two namespaces are two entries and a prefix is reused only inside its own namespace.
Everything keyed by tree keys (the pool's pages, the second tier's copies, pins, sessions' pins,
beams, fork donors) follows. Namespace 0 is the base model without a salt (its keys are the token
ids); every other (adapter, salt) pair gets the next id when first seen.

Ids are never reused: a namespace forgotten (its adapter unloaded, or a salt pushed out of the
table) leaves entries nobody can match, which age out of the pool like any others; a reused id
would hand them to whoever got it. Salts are client-chosen, so the table keeps at most
MAX_SALTED_NAMESPACES of them, least recently used out first; an adapter's unsalted namespace is
bounded by the adapters loaded and goes when its adapter is unloaded.
"""

from __future__ import annotations

from collections import OrderedDict

KEY_STRIDE = 1 << 32
MAX_SALTED_NAMESPACES = 4096  # ~1 MB of salts at their 256-character bound


class TreeNamespaces:
    def __init__(self, max_salted: int = MAX_SALTED_NAMESPACES):
        self.max_salted = max_salted
        # (adapter, salt) -> namespace id, least recently used first
        self._ids: OrderedDict[tuple[str | None, str | None], int] = OrderedDict()
        self._num_salted = 0
        self._plain: set[int] = {0}  # the unsalted namespaces' ids
        self._next_id = 1

    def key_offset(self, adapter: str | None, salt: str | None) -> int:
        """The tree key offset of requests of adapter (None: the base model) under salt (None:
        none); 0 for the base model unsalted."""
        if adapter is None and salt is None:
            return 0
        key = (adapter, salt)
        ns = self._ids.pop(key, None)
        if ns is None:
            ns, self._next_id = self._next_id, self._next_id + 1
            self._num_salted += salt is not None
            if salt is None:
                self._plain.add(ns)
        self._ids[key] = ns  # most recently used last
        if self._num_salted > self.max_salted:
            self._forget_oldest_salted()
        return ns * KEY_STRIDE

    def _forget_oldest_salted(self) -> None:
        for key in self._ids:
            if key[1] is not None:
                del self._ids[key]
                self._num_salted -= 1
                return

    def retire(self, adapter: str) -> set[int]:
        """Adapter was unloaded: its namespaces (unsalted and salted) are forgotten. Their ids (the
        caller evicts their entries; a reloaded adapter gets new ones)."""
        gone = [key for key in self._ids if key[0] == adapter]
        self._num_salted -= sum(key[1] is not None for key in gone)
        ids = {self._ids.pop(key) for key in gone}
        self._plain -= ids
        return ids

    def is_plain(self, ns: int) -> bool:
        """Whether namespace ns is unsalted (the base model or an adapter, still known): its keys
        are token ids anyone may see decoded in an admin view; a salted or forgotten one's are
        not."""
        return ns in self._plain

    def __len__(self) -> int:
        return len(self._ids)
