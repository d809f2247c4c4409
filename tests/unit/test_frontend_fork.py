"""fork/join (parallel branches, pinned shared prefix), streaming and run_batch on the
scripted fake runtime."""

from __future__ import annotations

import asyncio
import time

import pytest
from frontend_fake_backend import FakeBackend

import radixrt as sgl


def test_fork_caches_and_pins_the_prefix_once_runs_branches_in_parallel_and_joins():
    be = FakeBackend(respond=lambda p, sp: " b" + p[-1], delay=0.3)

    @sgl.function
    def tot(s):
        s += "The shared question is long enough to matter."
        forks = s.fork(3)
        forks += lambda i: f" Path {i}:"
        forks += sgl.gen("idea", max_tokens=4)
        forks.join()
        s += " Done"

    t0 = time.time()
    state = tot.run(backend=be)
    elapsed = time.time() - t0
    assert state["idea"] == [" b:", " b:", " b:"]
    assert state.text().endswith("matter. Done")
    # one pin request (prefill) before the branches, released at join
    assert be.pin_log == [("pin", "pin-1"), ("unpin", "pin-1")] and not be.pins
    branch_reqs = [r for r in be.log if "Path" in r["prompt"]]
    prefix_len = len(be.tokenize("The shared question is long enough to matter."))
    assert len(branch_reqs) == 3 and all(r["cached_tokens"] >= prefix_len for r in branch_reqs)
    # three 0.3 s requests overlapped (the pin took one more): well under 4 * 0.3 s
    assert elapsed < 0.3 * 3.5, elapsed
    assert len({r["thread"] for r in branch_reqs}) == 3


def test_fork_without_pin_support_caches_with_max_new_tokens_zero():
    be = FakeBackend(supports_pin=False)

    @sgl.function
    def prog(s):
        s += "prefix text"
        f = s.fork(2)
        f += sgl.gen("x", max_tokens=2)
        f.join()

    prog.run(backend=be)
    assert be.log[0]["prompt"] == "prefix text" and be.log[0]["sampling"] == {"max_new_tokens": 0}
    assert be.pin_log == []


def test_fork_before_any_text_and_nested_forks():
    be = FakeBackend(respond=lambda p, sp: " x")

    @sgl.function
    def prog(s):
        f = s.fork(2)  # nothing to cache yet: must not send an empty prompt
        for i, b in enumerate(f):
            b += f"B{i}"
            inner = b.fork(2)
            inner += sgl.gen("leaf", max_tokens=1)
            inner.join()
        f.join()

    state = prog.run(backend=be)
    assert all(r["prompt"] for r in be.log)
    assert state["leaf"] == [[" x", " x"], [" x", " x"]]
    assert not be.pins and [k for k, _ in be.pin_log].count("pin") == 2


def test_join_concate_and_append():
    be = FakeBackend(respond=lambda p, sp: "!")

    @sgl.function
    def prog(s):
        s += "P"
        f = s.fork(2)
        f += ["a", "b"]
        f.join("concate_and_append")

    assert prog.run(backend=be).text() == "Pab"


def test_unjoined_fork_pin_is_released_when_the_program_ends():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "prefix"
        f = s.fork(2)
        f += sgl.gen("x", max_tokens=1)

    prog.run(backend=be)
    assert not be.pins and be.pin_log[-1][0] == "unpin"


def test_streaming_text_iter_yields_pieces_in_order():
    be = FakeBackend(respond=lambda p, sp: " one two three", stream_delay=0.01)

    @sgl.function
    def prog(s):
        s += "Say:" + sgl.gen("words", max_tokens=10)
        s += " end"

    state = prog.run(backend=be, stream=True)
    pieces = list(state.text_iter("words"))
    assert len(pieces) >= 2 and "".join(pieces) == " one two three"
    whole = prog.run(backend=be, stream=True)
    assert "".join(whole.text_iter()) == "Say: one two three end"

    async def collect():
        st = prog.run(backend=be, stream=True)
        return [c async for c in st.text_async_iter("words")]

    assert "".join(asyncio.run(collect())) == " one two three"


def test_run_batch_precaches_the_constant_prefix_and_keeps_per_program_errors():
    be = FakeBackend(respond=lambda p, sp: " ok")
    instructions = "You are a careful assistant. Answer each question in one short sentence. "

    @sgl.function
    def qa(s, q, temp=0.0):
        s += instructions + "Q: " + q + "\nA:"
        s += sgl.gen("a", max_tokens=4, temperature=temp)

    batch = [{"q": f"question {i}"} for i in range(6)] + [{"q": "bad", "temp": -1.0}]
    states = qa.run_batch(batch, backend=be, num_threads=4, progress_bar=False)
    assert [s["a"] for s in states[:6]] == [" ok"] * 6
    assert be.log[0]["prompt"] == instructions + "Q: "  # the traced prefix, cached first
    assert isinstance(states[6].error(), sgl.ProgramError)
    with pytest.raises(sgl.ProgramError):
        states[6].text()
    assert not be.pins
    # positional tuples work too
    assert qa.run_batch([("x",)], backend=be)[0]["a"] == " ok"


def test_a_refused_pin_falls_back_to_plain_prefix_caching():
    class Refusing(FakeBackend):
        def pin_prefix(self, text, program_id=None):
            raise ValueError("pin would hold too much of the KV pool")

    be = Refusing()

    @sgl.function
    def prog(s):
        s += "shared prefix"
        f = s.fork(2)
        f += sgl.gen("x", max_tokens=1)
        f.join()

    prog.run(backend=be)
    assert be.log[0]["prompt"] == "shared prefix" and be.log[0]["sampling"] == {"max_new_tokens": 0}


def test_branches_extended_one_by_one_then_together():
    """SGLang's parallel-decoding idiom: each branch gets its own text with forks[i] += ..., then all
    generate; a branch cannot be swapped for another state."""
    be = FakeBackend(respond=lambda p, sp: " <" + p.split("Path ")[-1][:1] + ">")

    @sgl.function
    def prog(s):
        s += "Question: which way?"
        forks = s.fork(3)
        for i in range(3):
            forks[i] += f" Path {i}:"
        forks += sgl.gen("step", max_tokens=8)
        forks.join()
        with pytest.raises(TypeError, match="cannot be replaced"):
            forks[0] = forks[1]

    state = prog.run(backend=be)
    assert state["step"] == [" <0>", " <1>", " <2>"]
    prompts = sorted(r["prompt"] for r in be.log if "Path" in r["prompt"])
    assert prompts == [f"Question: which way? Path {i}:" for i in range(3)]
