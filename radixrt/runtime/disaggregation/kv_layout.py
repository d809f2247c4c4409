"""Where a page's bytes are: the KV pool is one tensor per layer for K and V (plus scales when
quantised), page p of a tensor at base + p * page_bytes. A transfer is, for each tensor, the runs
of pages that are consecutive on both sides, one (source, destination, length) region each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KVLayout:
    """Each pool tensor's base address and bytes per page, in the pool's tensor order."""

    bases: tuple[int, ...]
    page_bytes: tuple[int, ...]

    @classmethod
    def of_pool(cls, tensors: list[Any], page_size: int) -> "KVLayout":
        """The layout of KVCache.tensors() (each [num_slots, ...], contiguous)."""
        for t in tensors:
            assert t.is_contiguous(), "a KV pool tensor must be contiguous to be sent by pages"
        return cls(
            tuple(t.data_ptr() for t in tensors),
            tuple(t[0].numel() * t.element_size() * page_size for t in tensors),
        )

    @property
    def bytes_per_page(self) -> int:
        return sum(self.page_bytes)

    def to_wire(self) -> dict[str, list[int]]:
        return {"bases": list(self.bases), "page_bytes": list(self.page_bytes)}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "KVLayout":
        return cls(tuple(int(x) for x in d["bases"]), tuple(int(x) for x in d["page_bytes"]))


def page_runs(src_pages: list[int], dst_pages: list[int]) -> list[tuple[int, int, int]]:
    """(first source page, first destination page, pages) for each run consecutive on both
    sides."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src_pages, dst_pages):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def regions(
    src: KVLayout, src_pages: list[int], dst: KVLayout, dst_pages: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Source addresses, destination addresses and lengths that copy src_pages[i] into
    dst_pages[i] in every tensor. ValueError when the two pools do not hold the same bytes per
    page (another model, page size or KV dtype)."""
    if src.page_bytes != dst.page_bytes:
        raise ValueError(
            f"the servers' KV pages differ ({len(src.page_bytes)} tensors, "
            f"{src.bytes_per_page} bytes a page here; {len(dst.page_bytes)} tensors, "
            f"{dst.bytes_per_page} bytes there): run both with the same model, --page-size and "
            "--kv-cache-dtype"
        )
    if len(src_pages) != len(dst_pages):
        raise ValueError(f"{len(dst_pages)} pages asked for, {len(src_pages)} to send")
    runs = page_runs(src_pages, dst_pages)
    srcs, dsts, lens = [], [], []
    for s_base, d_base, size in zip(src.bases, dst.bases, src.page_bytes):
        for s, d, n in runs:
            srcs.append(s_base + s * size)
            dsts.append(d_base + d * size)
            lens.append(n * size)
    return srcs, dsts, lens
