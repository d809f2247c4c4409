"""A node of the radix tree (radix_cache.py): the edge's token ids, where their KV lives, locks and
LRU age."""

from __future__ import annotations

import itertools
from typing import Any


class TreeNode:
    _ids = itertools.count()

    def __init__(self, key: list[int], value: list[int] | None, parent: TreeNode | None):
        self.key = key  # token ids of the edge into this node
        # pool page ids of those tokens (len(key) // page_size of them); None when the KV is only in
        # the second tier (tiered_cache.py)
        self.value: list[int] | None = value
        # the second tier's pages of them, if written there
        self.host_value: list[int] | None = None
        self.loading = False  # being loaded back from the tier: the tier may not drop it meanwhile
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        # time.time() of the last match or insert through it (cache view)
        self.last_access_time = 0.0
        self.hits = 0  # requests admitted with a cached prefix that ran through this whole edge
        self.node_id = next(TreeNode._ids)  # ties in the LRU heap break deterministically

    def __repr__(self) -> str:
        return (
            f"TreeNode(#{self.node_id}, tokens={len(self.key)}, pages={self.value}, "
            f"host={self.host_value}, lock={self.lock_ref})"
        )
