"""What a page of the KV pool is: one tensor per layer for K and V (plus scales when quantised),
page p of a tensor being rows [p * page_size, (p + 1) * page_size). Two servers can hand each other
pages only when every tensor's page holds the same bytes (same model, page size and KV dtype).

The layout travels in a decode server's `register` (wire.py) as itself: a msgspec Struct, so its
bounds are checked as the message decodes and the JSON shape is {"page_bytes": [...]}."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

MAX_TENSORS = 4096  # far above any model's 2 x layers (+ scales)
MAX_PAGE_BYTES = 1 << 32

PageSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE_BYTES)]


class KVLayout(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Each pool tensor's bytes per page, in the pool's tensor order."""

    page_bytes: Annotated[tuple[PageSize, ...], msgspec.Meta(min_length=1, max_length=MAX_TENSORS)]

    @classmethod
    def of_pool(cls, tensors: list[Any], page_size: int) -> KVLayout:
        """The layout of KVCache.tensors() (each [num_slots, ...], contiguous)."""
        for t in tensors:
            assert t.is_contiguous(), "a KV pool tensor must be contiguous to be sent by pages"
        return cls(page_bytes=tuple(t[0].numel() * t.element_size() * page_size for t in tensors))

    @property
    def bytes_per_page(self) -> int:
        return sum(self.page_bytes)

    def to_wire(self) -> dict[str, Any]:
        """The layout as JSON-ready builtins, for a message built by hand (a test's fake peer)."""
        return msgspec.to_builtins(self)

    def check_same(self, other: KVLayout) -> None:
        """ValueError when the two pools do not hold the same bytes per page (equality of two valid
        layouts: no type says that, so it is checked here, on the decoded value)."""
        if self.page_bytes != other.page_bytes:
            raise ValueError(
                f"the servers' KV pages differ ({len(self.page_bytes)} tensors, "
                f"{self.bytes_per_page} bytes a page here; {len(other.page_bytes)} tensors, "
                f"{other.bytes_per_page} bytes there): run both with the same model, --page-size "
                "and --kv-cache-dtype"
            )
