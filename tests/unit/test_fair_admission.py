"""#56.5: admission takes turns across clients (a request's turn: its client's running rows plus its
client's requests queued before it), so one client's long queue does not hold every running row,
and under --enable-priority-scheduling a higher priority goes first (SGLang's flag, and its
--schedule-low-priority-values-first). Truth: which requests the real scheduler runs after its
first step, on the fake runner (output a pure function of the tokens), and every output equal to
that request's output alone."""

from __future__ import annotations

from fake_runner import FakeRunner
from test_scheduler import VOCAB, assert_all_pages_back, drain, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions


def make(**cfg):
    config = ServerConfig(page_size=1, chunked_prefill_size=512, max_running_requests=4, **cfg)
    return Scheduler(config, FakeRunner(2000, 1, VOCAB, eos=None, max_rows=17))


def send(s, rid, client, priority=None):
    prompt = [3 + (len(rid) * 5 + k) % 40 for k in range(12)]
    options = RequestOptions(client=client, priority=priority)
    params = {"max_new_tokens": 6}
    s.add_request(
        TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=params, options=options)
    )


def running_after_first_step(s) -> set[str]:
    s.step()
    return {r.rid for r in s.running}


def test_a_flooding_client_does_not_hold_every_row():
    s = make()
    for i in range(12):
        send(s, f"a{i}", "addr:flooder")
    send(s, "b0", "addr:polite")
    send(s, "b1", "addr:polite")
    assert running_after_first_step(s) == {"a0", "b0", "a1", "b1"}  # FCFS ran a0..a3
    outs = drain(s)
    assert set(outs) == {f"a{i}" for i in range(12)} | {"b0", "b1"}
    alone = make()
    send(alone, "b1", "addr:polite")
    assert ids(outs, "b1") == ids(drain(alone), "b1")  # turns change when, never what
    assert_all_pages_back(s)


def test_one_client_alone_keeps_arrival_order():
    s = make()
    for i in range(8):
        send(s, f"a{i}", "addr:only")
    assert running_after_first_step(s) == {"a0", "a1", "a2", "a3"}
    drain(s)
    assert_all_pages_back(s)


def test_priority_scheduling_admits_higher_priority_first():
    for low_first, want in ((False, {"hi", "a0", "b0", "a1"}), (True, {"lo", "a0", "b0", "a1"})):
        s = make(enable_priority_scheduling=True, schedule_low_priority_values_first=low_first)
        for i in range(6):
            send(s, f"a{i}", "addr:x")
        send(s, "b0", "addr:y")
        send(s, "hi", "addr:z", priority=10)
        send(s, "lo", "addr:z", priority=-10)
        assert running_after_first_step(s) == want
        drain(s)
    off = make()  # without the flag, priority is ignored (SGLang's default)
    for i in range(6):
        send(off, f"a{i}", "addr:x")
    send(off, "hi", "addr:z", priority=10)
    assert running_after_first_step(off) == {"a0", "hi", "a1", "a2"}
