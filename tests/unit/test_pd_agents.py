"""The transfer agents of prefill-decode disaggregation (disaggregation/), over real ZeroMQ sockets
on loopback: the bootstrap exchange, the pages landing where the decode side registered them,
timeouts, cancels and a silent peer. The bytes move through a stand-in engine (memmove within this
process) here, and through Mooncake's real engine in the last test.

Truth: the source pool's pages compared with torch to the destination's, page by page; the pages
not registered stay untouched.
"""

import contextlib
import ctypes
import time

import pytest
import torch

from radixrt.runtime.core.pd_link import Bootstrap, KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation import decode_agent, prefill_agent
from radixrt.runtime.disaggregation.decode_agent import DecodeAgent
from radixrt.runtime.disaggregation.kv_layout import KVLayout, page_runs, regions
from radixrt.runtime.disaggregation.link import ThreadLink
from radixrt.runtime.disaggregation.page_stager import PageStager
from radixrt.runtime.disaggregation.prefill_agent import PrefillAgent
from radixrt.runtime.processes import free_port

PAGE = 4
FIRST = {"id": 17, "logprob": -0.5, "top_logprobs": None}


class MemmoveEngine:
    session = "in-process"

    def __init__(self):
        self.writes = 0
        self.registered: set[int] = set()

    def register(self, tensors):
        self.registered |= {t.data_ptr() for t in tensors}

    def unregister(self, tensors):
        self.registered -= {t.data_ptr() for t in tensors}

    def write(self, peer, srcs, dsts, lens):
        for s, d, n in zip(srcs, dsts, lens):
            ctypes.memmove(d, s, n)
        self.writes += 1


def pool(num_pages, fill, layers=3, quantized=False):
    shape = (num_pages * PAGE, 3, 8)
    gen = torch.Generator().manual_seed(0)
    make = (lambda s: torch.randn(s, generator=gen)) if fill else torch.zeros
    tensors = [make(shape) for _ in range(2 * layers)]
    if quantized:  # int8 pages plus a float32 scale per token and head
        tensors = [t.to(torch.int8) for t in tensors] + [make(shape[:2]) for _ in range(2 * layers)]
    return tensors


@contextlib.contextmanager
def linked(prefill_pool, decode_pool, prefill_timeout=30.0, decode_timeout=30.0):
    """A prefill and a decode link over loopback ZeroMQ: (prefill link, decode link, bootstrap port,
    the engine both write through), closed after."""
    p, d, port, engine = links(prefill_pool, decode_pool, prefill_timeout, decode_timeout)
    try:
        yield p, d, port, engine
    finally:
        p.close()
        d.close()


def links(prefill_pool, decode_pool, prefill_timeout=30.0, decode_timeout=30.0):
    import zmq

    ctx = zmq.Context.instance()
    port = free_port()
    p, d = ThreadLink(ctx), ThreadLink(ctx)
    engine = MemmoveEngine()
    p.start(
        PrefillAgent(
            ctx,
            p.cmd_addr,
            p.evt_addr,
            prefill_timeout,
            engine,
            KVLayout.of_pool(prefill_pool, PAGE),
            PageStager(prefill_pool, PAGE, engine),
            f"tcp://127.0.0.1:{port}",
        )
    )
    d.start(
        DecodeAgent(
            ctx,
            d.cmd_addr,
            d.evt_addr,
            decode_timeout,
            "x",
            KVLayout.of_pool(decode_pool, PAGE),
            PageStager(decode_pool, PAGE, engine),
        )
    )
    return p, d, port, engine


def wait_events(link, n=1, timeout=15.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += link.events()
        time.sleep(0.01)
    assert len(got) >= n, f"no event within {timeout} s"
    return got


def page(tensor, p):
    return tensor[p * PAGE : (p + 1) * PAGE]


@pytest.mark.parametrize("send_first", [True, False])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("staged", [False, True])
def test_the_registered_pages_receive_the_prompt_pages(send_first, quantized, staged, monkeypatch):
    if staged:  # scattered pages go through buffers (any number of regions, here)
        monkeypatch.setattr(prefill_agent, "DIRECT_MAX_REGIONS", 0)
    src, dst = pool(16, True, quantized=quantized), pool(16, False, quantized=quantized)
    with linked(src, dst) as (p, d, port, engine):
        src_pages, start = [3, 4, 5, 9, 1], 2  # the decode side had the first two cached
        dst_pages = [7, 8, 2]
        bootstrap = Bootstrap("127.0.0.1", port, 41)
        if send_first:
            p.send(41, src_pages, FIRST)
            time.sleep(0.1)
        d.expect(bootstrap, dst_pages, start)
        if not send_first:
            time.sleep(0.1)
            p.send(41, src_pages, FIRST)
        (arrived,) = wait_events(d)
        (sent,) = wait_events(p)
        assert isinstance(arrived, KVArrived) and arrived.first == FIRST
        assert isinstance(sent, KVSent) and sent.error is None
        page_bytes = KVLayout.of_pool(src, PAGE).bytes_per_page
        assert arrived.num_pages == sent.num_pages == 3
        assert arrived.num_bytes == sent.num_bytes == 3 * page_bytes
        for s_t, d_t in zip(src, dst):
            for s, q in zip(src_pages[start:], dst_pages):
                assert torch.equal(page(s_t, s), page(d_t, q))
            untouched = [q for q in range(16) if q not in dst_pages]
            assert all(not page(d_t, q).any() for q in untouched)
        assert not engine.registered  # staging buffers are let go


def test_pools_of_different_shapes_fail_with_the_reason_on_both_sides():
    src, dst = pool(8, True, layers=3), pool(8, False, layers=2)
    with linked(src, dst) as (p, d, port, engine):
        d.expect(Bootstrap("127.0.0.1", port, 1), [0, 1], 0)
        p.send(1, [2, 3], FIRST)
        (failed,) = wait_events(d)
        (sent,) = wait_events(p)
        assert isinstance(failed, KVFailed) and "pages differ" in failed.error
        assert "pages differ" in sent.error and engine.writes == 0


def test_a_cancel_before_the_prefill_finishes_answers_both_halves():
    src, dst = pool(8, True), pool(8, False)
    with linked(src, dst) as (p, d, port, engine):
        bootstrap = Bootstrap("127.0.0.1", port, 77)
        d.expect(bootstrap, [0, 1], 0)
        time.sleep(0.1)
        d.cancel(bootstrap)
        (failed,) = wait_events(d)
        assert isinstance(failed, KVFailed) and "aborted" in failed.error
        p.send(77, [2, 3], FIRST)  # the prefill side computed it after all: ended at once
        (sent,) = wait_events(p)
        assert "cancelled by the decode server" in sent.error and engine.writes == 0


def test_timeouts_on_both_sides():
    src, dst = pool(8, True), pool(8, False)
    with linked(src, dst, prefill_timeout=0.6, decode_timeout=0.6) as (p, d, port, _):
        started = time.monotonic()
        p.send(5, [1], FIRST)  # nobody registers
        d.expect(Bootstrap("127.0.0.1", port, 6), [1], 0)  # nobody sends
        (sent,) = wait_events(p)
        (failed,) = wait_events(d)
        assert "did not ask for the KV within 0.6 s" in sent.error
        assert isinstance(failed, KVFailed)
        assert "0.6 s" in failed.error or "no request for this room" in failed.error
        assert time.monotonic() - started < 5


def test_a_silent_prefill_server_fails_its_rooms(monkeypatch):
    monkeypatch.setattr(decode_agent, "PEER_SILENT_S", 1.0)
    d = ThreadLink(__import__("zmq").Context.instance())
    d.start(DecodeAgent(d.ctx, d.cmd_addr, d.evt_addr, 60.0, "x", KVLayout((0,), (16,)), None))
    try:
        started = time.monotonic()
        d.expect(Bootstrap("127.0.0.1", free_port(), 3), [0], 0)  # nothing listens there
        (failed,) = wait_events(d, timeout=10)
        assert isinstance(failed, KVFailed) and "stopped answering" in failed.error
        assert time.monotonic() - started < 4
    finally:
        d.close()


def test_regions_merge_runs_consecutive_on_both_sides():
    assert page_runs([3, 4, 5, 9, 10], [7, 8, 9, 1, 2]) == [(3, 7, 3), (9, 1, 2)]
    assert page_runs([1, 2], [5, 3]) == [(1, 5, 1), (2, 3, 1)]
    a = KVLayout((1000, 5000), (16, 8))
    b = KVLayout((20000, 90000), (16, 8))
    srcs, dsts, lens = regions(a, [0, 1, 4], b, [2, 3, 0])
    assert srcs == [1000, 1064, 5000, 5032]
    assert dsts == [20032, 20000, 90016, 90000]
    assert lens == [32, 16, 16, 8]


def test_mooncake_moves_the_pages():
    pytest.importorskip("mooncake.engine", reason="pip install mooncake-transfer-engine-non-cuda")
    from radixrt.runtime.disaggregation.mooncake_engine import MooncakeEngine

    src, dst = pool(8, True), pool(8, False)
    a, b = MooncakeEngine("127.0.0.1"), MooncakeEngine("127.0.0.1")
    a.register(src)
    b.register(dst)
    srcs, dsts, lens = regions(
        KVLayout.of_pool(src, PAGE), [1, 2, 6], KVLayout.of_pool(dst, PAGE), [5, 6, 0]
    )
    a.write(b.session, srcs, dsts, lens)
    for s_t, d_t in zip(src, dst):
        for s, q in ((1, 5), (2, 6), (6, 0)):
            assert torch.equal(page(s_t, s), page(d_t, q))
        assert not page(d_t, 3).any()
    with pytest.raises(RuntimeError, match="write to 127.0.0.1:1 failed"):
        a.write("127.0.0.1:1", srcs, dsts, lens)
    # staged: gathered into one buffer, written in one piece, scattered
    dst2 = pool(8, False)
    b.register(dst2)
    sent = PageStager(src, PAGE, a).gather([7, 0, 3])
    into = PageStager(dst2, PAGE, b)
    buf = into.buffer(sent.numel())
    a.write(b.session, [sent.data_ptr()], [buf.data_ptr()], [sent.numel()])
    into.scatter(buf, [2, 6, 1])
    for s_t, d_t in zip(src, dst2):
        for s, q in ((7, 2), (0, 6), (3, 1)):
            assert torch.equal(page(s_t, s), page(d_t, q))
