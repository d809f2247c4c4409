"""What the radix tree holds, as plain data for `GET /cache_tree`, the dashboard and
`radixrt cache-tree`.

Each node reports its edge (token count and the first few token ids, which the caller with a
tokenizer turns into a text preview), the requests that matched through it (`hits`), the cached
tokens those matches served (`tokens_served` = hits x edge tokens: a match never ends inside an
edge, because match_prefix splits it there), its age, lock references, pins and the sessions that
own them. A big tree is summarised, not dumped: children are visited largest subtree first, and
past `max_depth` levels or `max_nodes` nodes the rest of a node's children are folded into its
`omitted` figures. Building the view walks the tree once.

A node of a salted namespace (a cache_salt's: core/namespaces.py), or of one no longer known, shows
no token ids: its edges are another tenant's prompts, and this view is not where they are read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from radixrt.runtime.core.namespaces import KEY_STRIDE, adapter_part
from radixrt.runtime.core.radix_cache import RadixCache, TreeNode

DEFAULT_MAX_DEPTH = 16
DEFAULT_MAX_NODES = 500
MAX_NODES_LIMIT = 10_000  # what a caller may ask for at most (a view is JSON sent over HTTP)
MAX_DEPTH_LIMIT = 256
PREVIEW_TOKENS = 24  # token ids of an edge sent for its text preview
MAX_SESSIONS_LISTED = 8  # session ids named per node (its pins count them all)


def _subtree_totals(root: TreeNode) -> dict[int, tuple[int, int, int]]:
    """node_id -> (nodes, tokens, hits) of the subtree below and including each node, in one
    post-order walk."""
    totals: dict[int, tuple[int, int, int]] = {}
    stack: list[tuple[TreeNode, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children.values())
            continue
        nodes, tokens, hits = 1, len(node.key), node.hits
        for c in node.children.values():
            n, t, h = totals[c.node_id]
            nodes, tokens, hits = nodes + n, tokens + t, hits + h
        totals[node.node_id] = (nodes, tokens, hits)
    return totals


def cache_tree_view(
    tree: RadixCache,
    pinned: list[tuple[TreeNode, str | None]],
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_nodes: int = DEFAULT_MAX_NODES,
    preview_tokens: int = PREVIEW_TOKENS,
    plain: Callable[[int], bool] = lambda ns: ns == 0,
) -> dict[str, Any]:
    """{"root": node, "num_nodes", "num_tokens", "num_nodes_shown", "page_size", "disabled"}; each
    node: {"id", "num_tokens", "preview_ids", "hits", "tokens_served", "prefix_len",
    "last_access_age_s", "lock_ref", "residency", "pins", "sessions", "subtree_tokens", "children",
    "omitted": None or {"nodes", "tokens", "hits"}}.
    pinned: (last node of a pinned path, the session owning the pin or None for a program's pin).
    plain(namespace): whether that namespace's token ids may be shown (TreeNamespaces.is_plain; by
    default only the base model's)."""
    if max_depth < 1 or max_nodes < 1:
        raise ValueError(f"max_depth and max_nodes must be >= 1, got {max_depth} and {max_nodes}")
    now = time.time()
    pins, sessions = _pins_by_node(tree, pinned)
    totals = _subtree_totals(tree.root)
    describe = _Describer(now, pins, sessions, totals, preview_tokens, plain)
    root = describe(tree.root, 0)
    shown = _add_children(tree.root, root, describe, totals, max_depth, max_nodes)
    nodes, tokens, _ = totals[tree.root.node_id]
    return {
        "root": root,
        "num_nodes": nodes - 1,
        "num_tokens": tokens,
        "num_nodes_shown": shown,
        "page_size": tree.page_size,
        "disabled": tree.disable,
    }


def _pins_by_node(
    tree: RadixCache, pinned: list[tuple[TreeNode, str | None]]
) -> tuple[dict[int, int], dict[int, list[str]]]:
    """node_id -> the pins locking it, and -> the sessions owning them (at most
    MAX_SESSIONS_LISTED): a pin locks its whole path."""
    pins: dict[int, int] = {}
    sessions: dict[int, list[str]] = {}
    for node, session in pinned:
        while node is not None and node is not tree.root:
            pins[node.node_id] = pins.get(node.node_id, 0) + 1
            if (
                session is not None
                and len(sessions.setdefault(node.node_id, [])) < MAX_SESSIONS_LISTED
            ):
                sessions[node.node_id].append(session)
            node = node.parent
    return pins, sessions


@dataclass
class _Describer:
    """One node's view (without its children yet), from figures gathered once for the tree."""

    now: float
    pins: dict[int, int]
    sessions: dict[int, list[str]]
    totals: dict[int, tuple[int, int, int]]
    preview_tokens: int
    plain: Callable[[int], bool]

    def __call__(self, node: TreeNode, prefix_len: int) -> dict[str, Any]:
        n = len(node.key)
        ns = node.key[0] // KEY_STRIDE if node.key else 0
        shown = self.preview_tokens if self.plain(ns) else 0
        return {
            "id": node.node_id,
            "num_tokens": n,
            # token ids (keys carry their namespace's offset: core/namespaces.py)
            "preview_ids": [t % KEY_STRIDE for t in node.key[:shown]],
            # the namespace's adapter part (None: the base model); "salted" says whether a salt's
            # part is there too (a keyed hash, never shown: it is wider than JSON's integers)
            "lora_key": adapter_part(ns) or None,
            "salted": not self.plain(ns),
            "hits": node.hits,
            "tokens_served": node.hits * n,
            "prefix_len": prefix_len + n,
            "last_access_age_s": round(self.now - node.last_access_time, 3)
            if node.last_access_time
            else None,
            "lock_ref": node.lock_ref,
            # where its KV is: the pool, the second tier (--enable-hierarchical-cache), or both
            "residency": ("both" if node.host_value is not None else "pool")
            if node.value is not None
            else "tier",
            "pins": self.pins.get(node.node_id, 0),
            "sessions": sorted(self.sessions.get(node.node_id, [])),
            "subtree_tokens": self.totals[node.node_id][1],
            "children": [],
            "omitted": None,
        }


def _add_children(
    root: TreeNode,
    root_view: dict[str, Any],
    describe: _Describer,
    totals: dict[int, tuple[int, int, int]],
    max_depth: int,
    max_nodes: int,
) -> int:
    """Fill in the views' children below `root_view`, breadth-first so a node budget keeps the
    upper levels whole, siblings largest first; past the budget or max_depth a node's remaining
    children are summed into its "omitted". Returns the nodes shown besides the root."""
    shown = 0
    frontier: list[tuple[TreeNode, dict[str, Any], int]] = [(root, root_view, 0)]
    while frontier:
        nxt = []
        for node, out, depth in frontier:
            children = sorted(
                node.children.values(), key=lambda c: (-totals[c.node_id][1], c.node_id)
            )
            for i, child in enumerate(children):
                if depth >= max_depth or shown >= max_nodes:
                    out["omitted"] = _omitted([totals[c.node_id] for c in children[i:]])
                    break
                view = describe(child, out["prefix_len"])
                out["children"].append(view)
                shown += 1
                nxt.append((child, view, depth + 1))
        frontier = nxt
    return shown


def _omitted(rest: list[tuple[int, int, int]]) -> dict[str, int]:
    """The (nodes, tokens, hits) subtree totals of children left out of the view, summed."""
    return {
        "nodes": sum(r[0] for r in rest),
        "tokens": sum(r[1] for r in rest),
        "hits": sum(r[2] for r in rest),
    }


def pretty_print(tree: RadixCache) -> str:
    """The whole tree, one node per line, children in key order (for debugging and tests)."""

    def walk(node: TreeNode, depth: int):
        if node is not tree.root:
            yield node, depth
        for child in sorted(node.children.values(), key=lambda n: n.key):
            yield from walk(child, depth + 1)

    lines = [
        f"{'  ' * (depth - 1)}{n.key} pages={n.value} host={n.host_value} "
        f"lock={n.lock_ref} t={n.last_access}"
        for n, depth in walk(tree.root, 0)
    ]
    return "\n".join(lines + [f"evictable={tree.evictable_pages} protected={tree.protected_pages}"])
