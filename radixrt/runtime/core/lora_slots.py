"""LoRA adapters in the scheduler: which adapter sits in which of the runner's slots
(--max-loras-per-batch of them), and each adapter's namespace in the radix tree.

A request of an adapter is admitted only with a slot for it: the one its adapter already holds, a
free one, or the least recently used slot no running request holds; with none, it waits (and, to
keep arrival order, so does everyone behind it). The runner copies an adapter into its slot when
the plan names it there (model/lora_registry.py).

The radix tree knows nothing of adapters: a request's tree keys are its tokens plus its adapter's
offset (Req.tree_ids), a multiple of KEY_STRIDE (above any vocabulary), so identical prompts under
two adapters are two entries and a prefix is reused only under its own adapter. An unloaded
adapter's key is retired with its entries (a reloaded one gets a new key).
"""

from __future__ import annotations

from radixrt.runtime.core.req import Req

KEY_STRIDE = 1 << 32


class LoraSlots:
    def __init__(self, num_slots: int):
        self.names: list[str | None] = [None] * num_slots
        self._last_used = [0] * num_slots
        self._clock = 0
        self._keys: dict[str, int] = {}
        self._next_key = 1

    def key_offset(self, name: str | None) -> int:
        """The tree key offset of adapter name's requests (0: the base model)."""
        if name is None:
            return 0
        if name not in self._keys:
            self._keys[name], self._next_key = self._next_key, self._next_key + 1
        return self._keys[name] * KEY_STRIDE

    def take(self, name: str, running: list[Req]) -> int | None:
        """A slot holding adapter name for a request about to run, or None (all held)."""
        self._clock += 1
        if name in self.names:
            slot = self.names.index(name)
        else:
            held = {r.lora_slot for r in running if r.lora_slot is not None}
            free = [s for s in range(len(self.names)) if s not in held]
            if not free:
                return None
            slot = min(free, key=lambda s: (self.names[s] is not None, self._last_used[s]))
            self.names[slot] = name
        self._last_used[slot] = self._clock
        return slot

    def retire(self, name: str) -> int | None:
        """Adapter name was unloaded: its slot is free, its key retired. The retired key's offset
        (its tree entries are evicted by the caller), or None if it never had one."""
        if name in self.names:
            self.names[self.names.index(name)] = None
        key = self._keys.pop(name, None)
        return None if key is None else key * KEY_STRIDE
