"""Page allocator, slot arithmetic, req->slot table rows, KV tensor shapes."""

import pytest
import torch

from radixrt.runtime.core.page_allocator import PageAllocator, TableRows, slots_of
from radixrt.runtime.model.kv_cache import KVCache, ReqToSlotTable


def test_alloc_free_exhaustion():
    alloc = PageAllocator(num_pages=8, page_size=4)
    assert alloc.num_free == 8
    a = alloc.alloc(3)
    b = alloc.alloc(5)
    assert len(a) == 3 and len(b) == 5
    assert sorted(a + b) == list(range(8)), "every page handed out once"
    assert alloc.num_free == 0
    assert alloc.alloc(1) is None
    assert alloc.alloc(0) == []
    alloc.free(a)
    assert alloc.num_free == 3 and alloc.free_page_set() == set(a)
    assert alloc.alloc(4) is None, "a failed alloc takes nothing"
    assert alloc.num_free == 3
    c = alloc.alloc(3)
    assert sorted(c) == sorted(a)
    alloc.free(b)
    alloc.free(c)
    assert alloc.free_page_set() == set(range(8))


def test_low_ids_first():
    alloc = PageAllocator(num_pages=5, page_size=1)
    assert sorted(alloc.alloc(2)) == [0, 1]
    assert alloc.free_page_set() == {2, 3, 4}


def test_double_free_asserts():
    alloc = PageAllocator(num_pages=4, page_size=2)
    pages = alloc.alloc(2)
    alloc.free(pages)
    with pytest.raises(AssertionError):
        alloc.free(pages[:1])
    never_allocated = sorted(alloc.free_page_set())[0]
    with pytest.raises(AssertionError):
        alloc.free([never_allocated])


@pytest.mark.parametrize("num_pages,page_size", [(0, 1), (4, 0)])
def test_bad_sizes(num_pages, page_size):
    with pytest.raises(ValueError):
        PageAllocator(num_pages, page_size)


def test_pages_for():
    alloc = PageAllocator(num_pages=4, page_size=16)
    assert [alloc.pages_for(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_slots_of_page_size_1():
    assert slots_of([7, 3, 9, 2], 1, 3, 1) == [3, 9]
    assert slots_of([7, 3, 9, 2], 0, 0, 1) == []


def test_slots_of_page_size_16():
    page_ids = [5, 2, 9]
    slots = slots_of(page_ids, 0, 40, 16)
    expected = (
        [5 * 16 + i for i in range(16)]
        + [2 * 16 + i for i in range(16)]
        + [9 * 16 + i for i in range(8)]
    )
    assert slots == expected
    assert slots_of(page_ids, 14, 18, 16) == [5 * 16 + 14, 5 * 16 + 15, 2 * 16 + 0, 2 * 16 + 1]
    assert len(set(slots)) == len(slots)


def test_req_to_slot_table_rows():
    table = ReqToSlotTable(max_rows=3, max_context=10)
    assert table.table.shape == (3, 10) and table.table.dtype == torch.int64
    owner = TableRows(3)
    rows = [owner.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2] and owner.num_free == 0
    with pytest.raises(RuntimeError):
        owner.alloc()
    owner.free(rows[1])
    assert owner.num_free == 1
    with pytest.raises(AssertionError):
        owner.free(rows[1])  # twice
    assert owner.alloc() == rows[1]


def test_kv_cache_shapes_and_bytes():
    kv = KVCache(num_layers=3, num_slots=32, num_kv_heads=2, head_dim=8, dtype=torch.float16)
    assert len(kv.k) == len(kv.v) == 3
    for t in kv.k + kv.v:
        assert t.shape == (32, 2, 8) and t.dtype == torch.float16
    assert len({t.data_ptr() for t in kv.k + kv.v}) == 6, (
        "each layer's K and V are separate tensors"
    )
    # K and V, per layer, per head, per dim, 2 bytes each
    assert KVCache.bytes_per_token(3, 2, 8, torch.float16) == 2 * 3 * 2 * 8 * 2
    # the default model in fp32: 30 layers, 3 kv heads, head_dim 64
    assert KVCache.bytes_per_token(30, 3, 64, torch.float32) == 46080
    total = sum(t.numel() * t.element_size() for t in kv.k + kv.v)
    assert total == kv.num_slots * KVCache.bytes_per_token(3, 2, 8, torch.float16)
