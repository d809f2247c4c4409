"""The transfer agents of prefill-decode disaggregation (disaggregation/), over real ZeroMQ sockets
on loopback with CURVE (channel.py): the bootstrap exchange, the pages landing where the decode side
registered them (in one chunk or many), timeouts, cancels and a silent peer. Hostile peers have
their own battery (test_pd_hostile_peers.py).

Truth: the source pool's pages compared with torch to the destination's, page by page; the pages
not registered stay untouched.
"""

import contextlib
import time

import pytest
import torch

from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation import decode_agent, prefill_agent
from radixrt.runtime.disaggregation.decode_agent import DecodeAgent
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.prefill_agent import PrefillAgent
from radixrt.runtime.disaggregation.transfer import ThreadTransfer
from radixrt.runtime.processes import free_port
from radixrt.runtime.request.options import Bootstrap

PAGE = 4
FIRST = {"id": 17, "logprob": -0.5, "top_logprobs": None}
SECRET = "a-test-secret-of-the-pair"
VOCAB = 100


def pool(num_pages, fill, layers=3, quantized=False):
    shape = (num_pages * PAGE, 3, 8)
    gen = torch.Generator().manual_seed(0)
    make = (lambda s: torch.randn(s, generator=gen)) if fill else torch.zeros
    tensors = [make(shape) for _ in range(2 * layers)]
    if quantized:  # int8 pages plus a float32 scale per token and head
        tensors = [t.to(torch.int8) for t in tensors] + [make(shape[:2]) for _ in range(2 * layers)]
    return tensors


@contextlib.contextmanager
def linked(prefill_pool, decode_pool, prefill_timeout=30.0, decode_timeout=30.0, secret=SECRET):
    """A prefill and a decode KV transfer over loopback ZeroMQ: (prefill, decode, bootstrap
    port), closed after. secret: the decode side's (the prefill side has SECRET)."""
    p, d, port = links(prefill_pool, decode_pool, prefill_timeout, decode_timeout, secret)
    try:
        yield p, d, port
    finally:
        p.close()
        d.close()


def prefill_link(src, port, timeout=30.0):
    import zmq

    p = ThreadTransfer(zmq.Context.instance())
    layout, pages = KVLayout.of_pool(src, PAGE), PageBytes(src, PAGE)
    bind = f"tcp://127.0.0.1:{port}"
    p.start(PrefillAgent(p.ctx, p.cmd_addr, p.evt_addr, timeout, layout, pages, SECRET, bind))
    return p


def decode_link(dst, port, timeout=30.0, secret=SECRET):
    import zmq

    d = ThreadTransfer(zmq.Context.instance())
    layout, pages = KVLayout.of_pool(dst, PAGE), PageBytes(dst, PAGE)
    peers = (frozenset({f"127.0.0.1:{port}"}), VOCAB)
    d.start(DecodeAgent(d.ctx, d.cmd_addr, d.evt_addr, timeout, layout, pages, secret, *peers))
    return d


def links(prefill_pool, decode_pool, prefill_timeout=30.0, decode_timeout=30.0, secret=SECRET):
    port = free_port()
    p = prefill_link(prefill_pool, port, prefill_timeout)
    return p, decode_link(decode_pool, port, decode_timeout, secret), port


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
@pytest.mark.parametrize("chunked", [False, True])
def test_the_registered_pages_receive_the_prompt_pages(send_first, quantized, chunked, monkeypatch):
    if chunked:  # one page a message: the pages land in order, chunk after chunk
        monkeypatch.setattr(prefill_agent, "CHUNK_BYTES", 1)
    src, dst = pool(16, True, quantized=quantized), pool(16, False, quantized=quantized)
    with linked(src, dst) as (p, d, port):
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


def test_pools_of_different_shapes_fail_with_the_reason_on_both_sides():
    src, dst = pool(8, True, layers=3), pool(8, False, layers=2)
    with linked(src, dst) as (p, d, port):
        d.expect(Bootstrap("127.0.0.1", port, 1), [0, 1], 0)
        p.send(1, [2, 3], FIRST)
        (failed,) = wait_events(d)
        (sent,) = wait_events(p)
        assert isinstance(failed, KVFailed) and "pages differ" in failed.error
        assert "pages differ" in sent.error
        assert not any(t.any() for t in dst)


def test_a_cancel_before_the_prefill_finishes_answers_both_halves():
    src, dst = pool(8, True), pool(8, False)
    with linked(src, dst) as (p, d, port):
        bootstrap = Bootstrap("127.0.0.1", port, 77)
        d.expect(bootstrap, [0, 1], 0)
        time.sleep(0.1)
        d.cancel(bootstrap)
        (failed,) = wait_events(d)
        assert isinstance(failed, KVFailed) and "aborted" in failed.error
        time.sleep(0.2)  # the cancel reaches the prefill side
        p.send(77, [2, 3], FIRST)  # the prefill side computed it after all: ended at once
        (sent,) = wait_events(p)
        assert "cancelled by the decode server" in sent.error
        assert not any(t.any() for t in dst)


def test_timeouts_on_both_sides():
    src, dst = pool(8, True), pool(8, False)
    with linked(src, dst, prefill_timeout=0.6, decode_timeout=0.6) as (p, d, port):
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
    port = free_port()  # nothing listens there
    d = decode_link(pool(2, False), port, timeout=60.0)
    try:
        started = time.monotonic()
        d.expect(Bootstrap("127.0.0.1", port, 3), [0], 0)
        (failed,) = wait_events(d, timeout=10)
        assert isinstance(failed, KVFailed) and "stopped answering" in failed.error
        assert time.monotonic() - started < 4
    finally:
        d.close()


def test_page_bytes_gather_and_scatter_are_inverse():
    src, dst = pool(8, True, quantized=True), pool(8, False, quantized=True)
    data = PageBytes(src, PAGE).gather([7, 0, 3])
    PageBytes(dst, PAGE).scatter(memoryview(data.numpy()), [2, 6, 1])
    for s_t, d_t in zip(src, dst):
        for s, q in ((7, 2), (0, 6), (3, 1)):
            assert torch.equal(page(s_t, s), page(d_t, q))
        assert not page(d_t, 0).any()
    with pytest.raises(ValueError, match="bytes for 2 pages"):
        PageBytes(dst, PAGE).scatter(memoryview(data.numpy()), [2, 6])
