"""What a page of the KV pool is: one tensor per layer for K and V (plus scales when quantised),
page p of a tensor being rows [p * page_size, (p + 1) * page_size). Two servers can hand each other
pages only when every tensor's page holds the same bytes (same model, page size and KV dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixrt.runtime.disaggregation.peer_checks import PeerError, check_int

MAX_TENSORS = 4096  # far above any model's 2 x layers (+ scales)
MAX_PAGE_BYTES = 1 << 32


@dataclass(frozen=True)
class KVLayout:
    """Each pool tensor's bytes per page, in the pool's tensor order."""

    page_bytes: tuple[int, ...]

    @classmethod
    def of_pool(cls, tensors: list[Any], page_size: int) -> "KVLayout":
        """The layout of KVCache.tensors() (each [num_slots, ...], contiguous)."""
        for t in tensors:
            assert t.is_contiguous(), "a KV pool tensor must be contiguous to be sent by pages"
        return cls(tuple(t[0].numel() * t.element_size() * page_size for t in tensors))

    @property
    def bytes_per_page(self) -> int:
        return sum(self.page_bytes)

    def to_wire(self) -> dict[str, list[int]]:
        return {"page_bytes": list(self.page_bytes)}

    @classmethod
    def from_wire(cls, d: Any) -> "KVLayout":
        """A peer's layout, checked (PeerError naming what is wrong)."""
        sizes = d.get("page_bytes") if isinstance(d, dict) else None
        if not isinstance(sizes, list) or not 0 < len(sizes) <= MAX_TENSORS:
            raise PeerError("layout.page_bytes must be a list of at most 4096 sizes")
        return cls(tuple(check_int(s, "layout.page_bytes", 1, MAX_PAGE_BYTES) for s in sizes))

    def check_same(self, other: "KVLayout") -> None:
        """ValueError when the two pools do not hold the same bytes per page."""
        if self.page_bytes != other.page_bytes:
            raise ValueError(
                f"the servers' KV pages differ ({len(self.page_bytes)} tensors, "
                f"{self.bytes_per_page} bytes a page here; {len(other.page_bytes)} tensors, "
                f"{other.bytes_per_page} bytes there): run both with the same model, --page-size "
                "and --kv-cache-dtype"
            )
