"""The length of the common prefix of two token lists: the one implementation, used by the radix
tree's edge matching, admission's in-flight sharing and the frontend's prompt-logprob starts."""

from __future__ import annotations

from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix, comparing slices (C speed) before single tokens (a list and a
    tuple never compare equal as slices: then the tokens decide)."""
    n = min(len(a), len(b))
    i, step = 0, 64
    while i < n:
        j = min(i + step, n)
        if a[i:j] != b[i:j]:
            while i < j and a[i] == b[i]:
                i += 1
            if i < j:
                return i
        i = j
    return n
