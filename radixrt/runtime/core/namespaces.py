"""The radix tree's namespaces: KV is shared only between requests of the same LoRA adapter and
the same cache_salt (vLLM's request field: a tenant, a trust domain).

The tree knows nothing of adapters or tenants: a request's tree keys are its tokens plus its
namespace's offset (Req.tree_ids), a multiple of KEY_STRIDE (above any vocabulary), so identical
prompts in two namespaces are two entries and a prefix is reused only inside its own namespace.
Everything keyed by tree keys (the pool's pages, the second tier's copies, pins, sessions' pins,
beams, fork donors) follows. Namespace 0 is the base model without a salt (its keys are the token
ids).

A namespace id is two parts: the adapter's (0 for the base model; each loaded adapter a number of
its own, never reused, so a reloaded adapter matches nothing its earlier load cached) and the
salt's (0 without one; else a 64-bit keyed hash of the salt under a key drawn per process). No
table of salts exists, so nothing a client sends can push another tenant's salt out of one: until
#56.6 salts had ids from a table of 4,096, least recently used out, and 4,097 one-token requests
with fresh salts made every other tenant's cached KV unmatchable. Two salts share an id only on a
64-bit collision of a keyed hash nobody outside the process can compute. Unloading an adapter
evicts every entry of its part, salted or not.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_STRIDE = 1 << 32
ADAPTER_BITS = 32  # the adapter's part is the id's low bits: an unsalted namespace's id is small


def adapter_part(ns: int) -> int:
    """The adapter's part of namespace id ns (0: the base model)."""
    return ns & ((1 << ADAPTER_BITS) - 1)


def is_salted(ns: int) -> bool:
    return ns >> ADAPTER_BITS != 0


class TreeNamespaces:
    def __init__(self):
        self._key = secrets.token_bytes(32)  # salts' ids are unpredictable and per process
        self._adapters: dict[str, int] = {}  # loaded adapter -> its part (never reused)
        self._next_adapter = 1

    def key_offset(self, adapter: str | None, salt: str | None) -> int:
        """The tree key offset of requests of adapter (None: the base model) under salt (None:
        none); 0 for the base model unsalted."""
        if adapter is None and salt is None:
            return 0
        part = 0
        if adapter is not None:
            part = self._adapters.get(adapter, 0)
            if not part:
                part, self._next_adapter = self._next_adapter, self._next_adapter + 1
                self._adapters[adapter] = part
        return ((self._salt_id(salt) << ADAPTER_BITS) | part) * KEY_STRIDE

    def _salt_id(self, salt: str | None) -> int:
        if salt is None:
            return 0
        digest = hmac.new(self._key, salt.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return int.from_bytes(digest.digest()[:8], "big") or 1  # 0 is "no salt"

    def retire(self, adapter: str) -> set[int]:
        """Adapter was unloaded: its part (of its unsalted and salted namespaces alike) is
        forgotten and returned, for the caller to evict (a reloaded adapter gets a new one)."""
        part = self._adapters.pop(adapter, 0)
        return {part} if part else set()

    def is_plain(self, ns: int) -> bool:
        """Whether namespace ns is unsalted (the base model or an adapter, still loaded): its keys
        are token ids anyone may see decoded in an admin view; a salted or forgotten one's are
        not."""
        part = adapter_part(ns)
        return not is_salted(ns) and (part == 0 or part in self._adapters.values())
