"""Drafts from the radix tree (#57): a request's next tokens guessed from what the tree holds after
its current tokens, i.e. what other requests of its namespace (salt, adapter) were given or asked
after the same text. The same question asked again drafts the whole earlier answer; a few-shot
program's shared turns draft the parts its earlier runs wrote. Suffix-decoding style: the longest
continuation the tree holds, the child most requests ran through at each branch (the most recently
used on ties).

The lookup is read-only: it splits no edge, stamps no LRU age and takes no lock, so a draft never
changes what the cache keeps. The draft goes the way prompt-lookup drafts go (prompt_lookup.py,
drafts.py): fed after the request's last token, kept up to the model's first disagreeing pick, so a
wrong guess costs compute, never output.

cached_len, the same kind of read-only walk, says how much of a waiting prompt the pool holds (the
fair share's estimate of what its prefill will compute).
"""

from __future__ import annotations

from radixrt.runtime.core.radix_cache import RadixCache
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.token_prefix import common_prefix_len
from radixrt.runtime.core.tree_node import TreeNode


def continuation(tree: RadixCache, ids: list[int], limit: int) -> list[int]:
    """Up to `limit` tree ids the tree holds right after `ids` (tree ids); [] when ids leave the
    tree (or the cache is off)."""
    if tree.disable or limit <= 0 or not ids:
        return []
    node, pos, n = tree.root, 0, len(ids)
    while True:
        child = _child(tree, node, ids, pos)
        if child is None:
            return []
        m = common_prefix_len(child.key, ids[pos : pos + len(child.key)])
        if pos + m == n:  # ids end inside (or at the end of) this edge
            out = list(child.key[m : m + limit])
            node = child
            break
        if m < len(child.key):
            return []  # ids leave the tree inside this edge
        node, pos = child, pos + m
    while len(out) < limit and node.children:
        node = max(node.children.values(), key=lambda c: (c.hits, c.last_access))
        out.extend(node.key[: limit - len(out)])
    return out


def _child(tree: RadixCache, node: TreeNode, ids: list[int], pos: int) -> TreeNode | None:
    """node's child that ids[pos:] runs into: by its first page, or, with less than a page of ids
    left (page_size > 1), the most used child whose key starts with them."""
    left = len(ids) - pos
    if left >= tree.page_size:
        return node.children.get(tree._child_key(ids, pos))
    tail = ids[pos:]
    fits = [c for c in node.children.values() if c.key[:left] == tail]
    return max(fits, key=lambda c: (c.hits, c.last_access)) if fits else None


def tree_draft(tree: RadixCache, req: Req, limit: int) -> list[int]:
    """req's next tokens as the tree holds them after its prompt and output so far (token ids)."""
    out = continuation(tree, req.tree_ids(req.fill_ids), limit)
    return [t - req.key_offset for t in out] if req.key_offset else out


def cached_len(tree: RadixCache, ids: list[int]) -> int:
    """Tokens of ids' longest whole-page prefix held in the pool, read-only (no split, no LRU
    stamp): an estimate for planning; admission's match_prefix is the one that counts."""
    node, pos, end = tree.root, 0, len(ids) - len(ids) % tree.page_size
    while pos < end and not tree.disable:
        child = node.children.get(tree._child_key(ids, pos))
        if child is None or child.value is None:
            break
        m = tree._match_len(child.key, ids, pos)  # whole pages, as match_prefix counts them
        node, pos = child, pos + m
        if m < len(child.key):
            break
    return pos
