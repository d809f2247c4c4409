"""The Scheduler's admin calls (pins, sessions, flush, the cache view, live figures, integrity): they
read or release state between steps and never plan a forward."""

from __future__ import annotations

from radixrt.runtime.core import cache_view
from radixrt.runtime.core.scheduler_stats import check_integrity, server_info


class SchedulerAdmin:
    """Mixed into Scheduler: uses its pins, sessions, tree and running list."""

    def unpin(self, handle: str) -> bool:
        return self.pins.unpin(handle)

    def close_session(self, session_id: str) -> bool:
        return self.sessions.close(session_id)

    def flush_cache(self) -> bool:
        """Empty the tree; sessions are a cache hint and end with it, a program's explicit pins refuse it."""
        if self.running:
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
        return cache_view.cache_tree_view(self.tree, pinned, max_depth, max_nodes)

    def server_info(self, walk: bool = True) -> dict:
        """Live figures; walk: also run the full integrity check (O(pages)) instead of reporting the
        last one's result. The serving loop walks only when idle, so a scrape never costs a step."""
        return server_info(self, walk)

    def check_integrity(self) -> None:
        check_integrity(self)
