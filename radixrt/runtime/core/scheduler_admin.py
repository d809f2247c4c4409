"""The Scheduler's admin calls (pins, sessions, flush, the cache view, LoRA adapters, live figures,
integrity): they read or release state between steps and never plan a forward."""

from __future__ import annotations

import time
from typing import Any

from radixrt.runtime.core import cache_view
from radixrt.runtime.core.namespaces import KEY_STRIDE
from radixrt.runtime.core.sessions import session_key


class SchedulerAdmin:
    """Mixed into Scheduler: uses its pins, sessions, tree and running list."""

    def get_grammar_backend(self, kind: str = "regex") -> Any:
        """The grammar backend for constraints of `kind` (--grammar-backend; ebnf: llguidance)."""
        if self.grammar_backends is None:
            raise ValueError("this scheduler was built without grammar backends: no constraints")
        return self.grammar_backends.for_kind(kind)

    def close(self) -> None:
        """Stop the grammar compile workers and what the runner started; the scheduler is done."""
        try:
            for backend in self.grammar_backends.built() if self.grammar_backends else []:
                backend.shutdown()
        finally:  # the runner's workers and tier file go even when a grammar backend fails
            try:
                self.runner.close()
            finally:
                if self.kv_link is not None:
                    self.kv_link.close()

    def unpin(self, handle: str) -> bool:
        return self.pins.unpin(handle)

    def close_session(self, session_id: str, cache_salt: str | None = None) -> bool:
        return self.sessions.close(session_key(session_id, cache_salt))

    def flush_cache(self) -> bool:
        """Empty the tree; sessions are a cache hint and end with it, a program's explicit pins
        refuse it."""
        if self.running or self.pd_held():
            return False
        self.sessions.clear()
        return self.tree.reset()

    def cache_tree(
        self,
        max_depth: int = cache_view.DEFAULT_MAX_DEPTH,
        max_nodes: int = cache_view.DEFAULT_MAX_NODES,
    ) -> dict:
        """What the radix tree holds (core/cache_view.py), token ids only."""
        owners = self.sessions.owners()
        pinned = [(node, owners.get(handle)) for node, handle in self.pins.pinned_nodes()]
        return cache_view.cache_tree_view(
            self.tree, pinned, max_depth, max_nodes, plain=self.namespaces.is_plain
        )

    def server_info(self, walk: bool = True) -> dict:
        """Live figures: counters, plus the integrity walk's result (walk: run it now, O(pages);
        otherwise the last one's, with its time: the serving loop walks only when idle, so a scrape
        never costs a step)."""
        st = self.stats
        if walk:
            try:
                self.check_integrity()
                st.integrity_error = None
            except AssertionError as e:
                st.integrity_error = str(e) or "integrity check failed"
            st.integrity_checked_at = time.time()
        return {
            "integrity_ok": st.integrity_error is None,
            "integrity_error": st.integrity_error,
            "integrity_checked_at": st.integrity_checked_at,
            "kv_pages_total": self.allocator.num_pages,
            "kv_pages_free": self.allocator.num_free,
            "kv_pages_evictable": self.tree.evictable_pages,
            "kv_pages_cached": self.tree.total_pages(),
            "page_size": self.page_size,
            "lora_adapters": self.runner.lora_names(),
            "max_loras_per_batch": self.config.max_loras_per_batch,
            "max_total_tokens": self.pool_tokens,
            "kv_bytes_per_token": self.runner.kv_bytes_per_token,
            "kv_pool_bytes": self.runner.kv_pool_bytes,
            "kv_cache_dtype": self.runner.kv_cache_dtype,
            "disaggregation_mode": self.pd_mode,
            "num_transferring": len(self.pd_held()),  # pages held for a KV transfer
            **st.transfer_info(),
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_preemptions": st.num_preemptions,
            "num_pins": len(self.pins),
            "num_pinned_tokens": self.pins.num_pinned_tokens,
            **self.sessions.info(),
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
            **self.tree.tier_info(),  # the second tier's figures (tiered_cache.py)
        }

    def check_lora(self, name: str) -> None:
        """A request's adapter must be loaded (ValueError naming it: a 400)."""
        if not isinstance(name, str) or name not in self.runner.lora_names():
            loaded = ", ".join(self.runner.lora_names()) or "none"
            raise ValueError(f"lora_path: LoRA adapter {name!r} is not loaded (loaded: {loaded})")

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter at path as name (ValueError: why it cannot be)."""
        self.check_lora_load(name)
        self.install_lora(self.read_lora(name, path))

    def read_lora(self, name: str, path: str) -> Any:
        """The adapter at path, read and checked (safe on another thread: it changes nothing)."""
        return self.runner.read_lora(name, path)

    def install_lora(self, adapter: Any) -> None:
        self.runner.install_lora(adapter)

    def check_lora_load(self, name: str) -> None:
        """A load of adapter name may go ahead: a free name, below --max-loaded-loras (ValueError:
        a 400). Checked before any file is read; the scheduler process then reads the adapter off
        its loop (runner.read_lora) and installs it (runner.install_lora)."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"lora_name must be a non-empty name without ':', got {name!r}")
        loaded = self.runner.lora_names()
        if name in loaded:
            raise ValueError(f"lora_name: a LoRA adapter named {name!r} is already loaded")
        if len(loaded) >= self.config.max_loaded_loras:
            raise ValueError(
                f"lora_name: {len(loaded)} LoRA adapters are loaded, the most --max-loaded-loras "
                "allows; unload one first"
            )

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter name: its slot and its radix tree entries go. Refused (ValueError)
        while requests of it are queued or running."""
        busy = sum(r.lora == name for r in self.waiting + self.running)
        if busy:
            raise ValueError(
                f"LoRA adapter {name!r} has {busy} requests in flight; unload it later"
            )
        self.runner.unload_lora(name)
        self.lora_slots.retire(name)
        gone = self.namespaces.retire(name)
        if gone:
            self.tree.evict_subtrees(lambda t: t // KEY_STRIDE in gone)

    def check_integrity(self) -> None:
        """Every page is exactly one of: free, held by the tree, owned by a running request; every
        table row is free or held by exactly one running request."""
        self.tree.check_integrity()
        free = self.allocator.free_page_set()
        assert len(free) == self.allocator.num_free, "a page is on the free list twice"
        tree_pages = self.tree.all_page_ids()
        assert len(set(tree_pages)) == len(tree_pages), "a page is in the tree twice"
        owned: list[int] = []
        holding = self.running + self.pd_held()
        for r in holding:
            num_borrowed = r.cached_len // self.page_size
            assert r.table_row is not None, f"{r} runs without a table row"
            assert r.cached_len <= r.kv_len <= r.seq_len, f"{r}: lengths out of order"
            assert len(r.page_ids) * self.page_size >= r.kv_len, f"{r}: pages do not cover its KV"
            assert set(r.page_ids[:num_borrowed]) <= set(tree_pages), (
                f"{r}: borrowed pages not in the tree"
            )
            owned.extend(r.page_ids[num_borrowed:])
        for r in self.waiting:
            assert not r.page_ids and r.table_row is None, f"waiting {r} holds memory"
        assert len(set(owned)) == len(owned), "two running requests own the same page"
        all_pages = free | set(tree_pages) | set(owned)
        assert (
            len(free) + len(tree_pages) + len(owned) == self.allocator.num_pages == len(all_pages)
        ), (
            f"pages leaked or shared: free {len(free)} + tree {len(tree_pages)} "
            f"+ owned {len(owned)} != {self.allocator.num_pages} (distinct {len(all_pages)})"
        )
        if not holding and not len(self.pins):
            assert self.tree.protected_pages == 0, "locks remain with nothing running or pinned"
        rows = [r.table_row for r in holding]
        free_rows = self.memory.rows.free_set()
        assert len(set(rows)) == len(rows) and not set(rows) & free_rows, "table rows shared"
        assert len(rows) + len(free_rows) == self.memory.rows.num_rows, "a table row leaked"
