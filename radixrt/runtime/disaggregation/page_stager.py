"""A transfer of scattered pages in one contiguous piece. Mooncake's TCP transport pays tens of
microseconds per region and refuses batches of a few thousand: a prompt whose pages are scattered in
either pool (page size 1, a pool that has run a while) would be thousands of tiny regions per
tensor. Such a transfer is staged instead: the prefill side gathers the pages of every pool tensor
into one registered buffer, the decode side receives it into one of its own and scatters it into
its pages (torch index_select / index_copy_, one per tensor)."""

from __future__ import annotations

from typing import Any

import torch


class PageStager:
    def __init__(self, tensors: list[torch.Tensor], page_size: int, engine: Any):
        """tensors: the pool's (KVCache.tensors(), contiguous); engine: registers the buffers."""
        # each tensor as [num_pages, page bytes] of raw bytes
        self.views = [t.view(torch.uint8).reshape(t.shape[0] // page_size, -1) for t in tensors]
        self.engine = engine

    def nbytes(self, num_pages: int) -> int:
        return num_pages * sum(v.shape[1] for v in self.views)

    def buffer(self, num_bytes: int) -> torch.Tensor:
        """A registered buffer for a staged transfer (release it after)."""
        buf = torch.empty(num_bytes, dtype=torch.uint8)
        self.engine.register([buf])
        return buf

    def release(self, buf: torch.Tensor) -> None:
        self.engine.unregister([buf])

    def _pieces(self, buf: torch.Tensor, num_pages: int):
        offset = 0
        for view in self.views:
            size = num_pages * view.shape[1]
            yield view, buf[offset : offset + size].view(num_pages, view.shape[1])
            offset += size

    def gather(self, pages: list[int]) -> torch.Tensor:
        """The pages of every tensor, tensor after tensor, in a registered buffer."""
        buf = self.buffer(self.nbytes(len(pages)))
        index = torch.tensor(pages, dtype=torch.int64)
        for view, piece in self._pieces(buf, len(pages)):
            torch.index_select(view, 0, index, out=piece)
        return buf

    def scatter(self, buf: torch.Tensor, pages: list[int]) -> None:
        """gather's inverse, into these pages."""
        index = torch.tensor(pages, dtype=torch.int64)
        for view, piece in self._pieces(buf, len(pages)):
            view.index_copy_(0, index, piece)
