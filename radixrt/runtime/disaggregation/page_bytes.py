"""Pages as one piece of bytes, and back: the prefill side gathers the pages of every pool tensor
into one buffer (torch index_select, one per tensor) that travels in a `pages` message; the decode
side copies it into the pages it registered for the room (index_copy_), and nowhere else."""

from __future__ import annotations

import torch


class PageBytes:
    def __init__(self, tensors: list[torch.Tensor], page_size: int):
        """tensors: the pool's (KVCache.tensors(), contiguous)."""
        # each tensor as [num_pages, page bytes] of raw bytes
        self.views = [t.view(torch.uint8).reshape(t.shape[0] // page_size, -1) for t in tensors]
        self.num_pages = self.views[0].shape[0] if self.views else 0

    def nbytes(self, num_pages: int) -> int:
        return num_pages * sum(v.shape[1] for v in self.views)

    def _pieces(self, buf: torch.Tensor, num_pages: int):
        offset = 0
        for view in self.views:
            size = num_pages * view.shape[1]
            yield view, buf[offset : offset + size].view(num_pages, view.shape[1])
            offset += size

    def gather(self, pages: list[int]) -> torch.Tensor:
        """The pages of every tensor, tensor after tensor, in one uint8 buffer."""
        buf = torch.empty(self.nbytes(len(pages)), dtype=torch.uint8)
        index = torch.tensor(pages, dtype=torch.int64)
        for view, piece in self._pieces(buf, len(pages)):
            torch.index_select(view, 0, index, out=piece)
        return buf

    def scatter(self, data: memoryview, pages: list[int]) -> None:
        """gather's inverse, into these pages; ValueError unless data is exactly their size."""
        if len(data) != self.nbytes(len(pages)):
            raise ValueError(f"{len(data)} bytes for {len(pages)} pages of {self.nbytes(1)} bytes")
        if any(not 0 <= p < self.num_pages for p in pages):
            raise ValueError("a page outside the pool")  # ours: a bug, never the peer's doing
        buf = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0)
        index = torch.tensor(pages, dtype=torch.int64)
        for view, piece in self._pieces(buf, len(pages)):
            view.index_copy_(0, index, piece)
