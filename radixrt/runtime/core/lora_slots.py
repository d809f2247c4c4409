"""LoRA adapters in the scheduler: which adapter sits in which of the runner's slots
(--max-loras-per-batch of them), and each adapter's namespace in the radix tree.

A request of an adapter is admitted only with a slot for it: the one its adapter already holds, a
free one, or the least recently used slot no running request holds; with none, it waits (and, to
keep arrival order, so does everyone behind it). The runner copies an adapter into its slot when
the plan names it there (model/lora_registry.py).

Each adapter's KV is a namespace of the radix tree of its own (with every cache_salt under it):
core/namespaces.py.
"""

from __future__ import annotations

from radixrt.runtime.core.req import Req


class LoraSlots:
    def __init__(self, num_slots: int):
        self.names: list[str | None] = [None] * num_slots
        self._last_used = [0] * num_slots
        self._clock = 0

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

    def retire(self, name: str) -> None:
        """Adapter name was unloaded: its slot is free (its tree namespaces go too:
        TreeNamespaces.retire)."""
        if name in self.names:
            self.names[self.names.index(name)] = None
