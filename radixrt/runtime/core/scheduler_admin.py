"""The Scheduler's admin calls (pins, sessions, flush, the cache view, LoRA adapters, live figures):
a facade over the scheduler's public parts (`scheduler.admin`). They read or release state between
steps and never plan a forward."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from radixrt.runtime.core import cache_view
from radixrt.runtime.core.namespaces import KEY_STRIDE, adapter_part
from radixrt.runtime.core.sessions import session_key

if TYPE_CHECKING:
    from radixrt.runtime.core.scheduler import Scheduler


class SchedulerAdmin:
    def __init__(self, scheduler: Scheduler):
        self.s = scheduler

    def unpin(self, handle: str) -> bool:
        return self.s.pins.unpin(handle)

    def close_session(self, session_id: str, cache_salt: str | None = None) -> bool:
        return self.s.sessions.close(session_key(session_id, cache_salt))

    def flush_cache(self) -> bool:
        """Empty the tree; sessions are a cache hint and end with it, a program's explicit pins
        refuse it."""
        if self.s.running or self.s.role.held():
            return False
        self.s.sessions.clear()
        return self.s.tree.reset()

    def cache_tree(
        self,
        max_depth: int = cache_view.DEFAULT_MAX_DEPTH,
        max_nodes: int = cache_view.DEFAULT_MAX_NODES,
    ) -> dict:
        """What the radix tree holds (core/cache_view.py), token ids only."""
        owners = self.s.sessions.owners()
        pinned = [(node, owners.get(handle)) for node, handle in self.s.pins.pinned_nodes()]
        return cache_view.cache_tree_view(
            self.s.tree, pinned, max_depth, max_nodes, plain=self.s.namespaces.is_plain
        )

    def server_info(self, walk: bool = True) -> dict:
        """Live figures: counters, plus the integrity walk's result (walk: run it now, O(pages);
        otherwise the last one's, with its time: the serving loop walks only when idle, so a scrape
        never costs a step)."""
        st = self.s.stats
        if walk:
            try:
                self.s.check_integrity()
                st.integrity_error = None
            except AssertionError as e:
                st.integrity_error = str(e) or "integrity check failed"
            st.integrity_checked_at = time.time()
        return {
            "integrity_ok": st.integrity_error is None,
            "integrity_error": st.integrity_error,
            "integrity_checked_at": st.integrity_checked_at,
            "kv_pages_total": self.s.memory.allocator.num_pages,
            "kv_pages_free": self.s.memory.allocator.num_free,
            "kv_pages_evictable": self.s.tree.evictable_pages,
            "kv_pages_cached": self.s.tree.total_pages(),
            "page_size": self.s.memory.page_size,
            "lora_adapters": self.s.runner.lora_names(),
            "max_loras_per_batch": self.s.config.max_loras_per_batch,
            "max_total_tokens": self.s.limits.pool_tokens,
            "kv_bytes_per_token": self.s.runner.kv_bytes_per_token,
            "kv_pool_bytes": self.s.runner.kv_pool_bytes,
            "kv_cache_dtype": self.s.runner.kv_cache_dtype,
            # the weight plan and when, on which CPU, it was measured (not in CLIENT_INFO: admin's)
            "weight_plan": getattr(self.s.runner, "weight_plan_info", None),
            # what a step of n tokens costs here, as fair_share learnt it (admin's too)
            "step_costs_ms": self.s.fair.costs.info(),
            "disaggregation_mode": self.s.role.name,
            "num_transferring": len(self.s.role.held()),  # pages held for a KV transfer
            **st.transfer_info(),
            "num_running": len(self.s.running),
            "num_waiting": len(self.s.waiting),
            "num_preemptions": st.num_preemptions,
            "num_pins": len(self.s.pins),
            "num_pinned_tokens": self.s.pins.num_pinned_tokens,
            **self.s.sessions.info(),
            "num_requests_admitted": st.num_admitted,
            "num_requests_finished": st.num_finished,
            "num_requests_aborted": st.num_aborted,
            "prompt_tokens": st.prompt_tokens,
            "cached_tokens": st.cached_tokens,
            "generated_tokens": st.generated_tokens,
            "cache_hit_rate": st.cached_tokens / st.prompt_tokens if st.prompt_tokens else 0.0,
            "jump_forward_draft_tokens": st.num_draft_tokens,
            "jump_forward_accepted_tokens": st.num_draft_accepted,
            "num_step_failures": st.num_step_failures,
            **self.s.tree.tier_info(),  # the second tier's figures (tiered_cache.py)
        }

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at path as name (ValueError: why it cannot be)."""
        self.check_lora_load(name)
        self.install_lora(self.read_lora(name, path))

    def read_lora(self, name: str, path: str) -> Any:
        """The adapter at path, read and checked (safe on another thread: it changes nothing)."""
        return self.s.runner.read_lora(name, path)

    def install_lora(self, adapter: Any) -> None:
        self.s.runner.install_lora(adapter)

    def check_lora_load(self, name: str) -> None:
        """A load of adapter name may go ahead: a free name, below --max-loaded-loras (ValueError:
        a 400). Checked before any file is read; the scheduler process then reads the adapter off
        its loop (runner.read_lora) and installs it (runner.install_lora)."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"lora_name must be a non-empty name without ':', got {name!r}")
        loaded = self.s.runner.lora_names()
        if name in loaded:
            raise ValueError(f"lora_name: a LoRA adapter named {name!r} is already loaded")
        if len(loaded) >= self.s.config.max_loaded_loras:
            raise ValueError(
                f"lora_name: {len(loaded)} LoRA adapters are loaded, the most --max-loaded-loras "
                "allows; unload one first"
            )

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter name: its slot and its radix tree entries go. Refused (ValueError)
        while requests of it are queued or running."""
        busy = sum(r.lora == name for r in self.s.waiting + self.s.running)
        if busy:
            raise ValueError(
                f"LoRA adapter {name!r} has {busy} requests in flight; unload it later"
            )
        self.s.runner.unload_lora(name)
        self.s.lora_slots.retire(name)
        gone = self.s.namespaces.retire(name)
        if gone:
            self.s.tree.evict_subtrees(lambda t: adapter_part(t // KEY_STRIDE) in gone)
