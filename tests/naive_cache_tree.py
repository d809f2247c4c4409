"""An independent model of what the radix tree should hold after a known sequence of requests, for
checking `/cache_tree` and core/cache_view.py: no tree, only prefixes of token lists.

Each request matches `query` (its prompt minus the last token: one position is always computed) against
the union of sequences cached before it, in whole pages; then its cached sequence (the prompt, cut to
whole pages) joins the union. Node boundaries fall where a cached sequence ends, where two diverge (at a
page boundary), and where a match ended (the tree splits an edge there). A node's hits are the requests
whose match covered its whole path."""

from __future__ import annotations

import os


def _lcp(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))  # works on any sequences, element by element


class NaiveCacheTree:
    def __init__(self, page_size: int):
        self.page_size = page_size
        self.cached: list[tuple[int, ...]] = []
        self.matches: list[
            tuple[int, ...]
        ] = []  # the matched prefix of every request (may be empty)

    def _pages(self, n: int) -> int:
        return n - n % self.page_size

    def request(self, query: list[int], cached_after: list[int]) -> int:
        """A request matching `query`, then leaving `cached_after` in the tree; returns its match length."""
        q = self._pages(len(query))
        matched = max([self._pages(_lcp(list(s), query[:q])) for s in self.cached] + [0])
        self.matches.append(tuple(query[:matched]))
        self.cached.append(tuple(cached_after[: self._pages(len(cached_after))]))
        return matched

    def nodes(self) -> dict[tuple[int, ...], dict]:
        """path (token tuple) -> {"parent": path, "num_tokens", "hits"} for every node but the root."""
        cuts = {s for s in self.cached if s} | {m for m in self.matches if m}
        for i, a in enumerate(self.cached):
            for b in self.cached[i + 1 :]:
                k = self._pages(_lcp(list(a), list(b)))
                if 0 < k:
                    cuts.add(a[:k])
        out = {}
        for path in cuts:
            parent = max(
                (c for c in cuts if len(c) < len(path) and path[: len(c)] == c), key=len, default=()
            )
            hits = sum(1 for m in self.matches if len(m) >= len(path) and m[: len(path)] == path)
            out[path] = {"parent": parent, "num_tokens": len(path) - len(parent), "hits": hits}
        return out

    def canonical(self) -> tuple:
        """(num_tokens, hits, children...) nested, children sorted: comparable with canonical_view()."""
        nodes = self.nodes()

        def build(path: tuple[int, ...]) -> tuple:
            kids = sorted(build(p) for p, n in nodes.items() if n["parent"] == path)
            own = nodes.get(path, {"num_tokens": 0, "hits": 0})
            return (own["num_tokens"], own["hits"], tuple(kids))

        return build(())


def canonical_view(node: dict) -> tuple:
    """The same shape from a /cache_tree node (its root included)."""
    return (
        node["num_tokens"],
        node["hits"],
        tuple(sorted(canonical_view(c) for c in node["children"])),
    )
