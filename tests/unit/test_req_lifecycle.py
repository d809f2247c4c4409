"""A request's lifecycle (core/req.py's ReqStatus): every path the scheduler takes a request along,
recorded transition by transition, is the one the issue describes for its case (plain, preempted,
waiting for its grammar, a beam search, both halves of disaggregation), and a transition the
lifecycle lacks is refused. The options a request arrived with reach its Req unchanged."""

from __future__ import annotations

import concurrent.futures
from collections import defaultdict

import pytest
from fake_runner import FakeRunner, reference_output
from test_scheduler import VOCAB, drain, ids, make, submit
from test_scheduler_pd import make_pair, run_pair, submit_both

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.req import Req, ReqStatus
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq, decode, encode
from radixrt.runtime.request.options import Bootstrap, RequestOptions
from radixrt.runtime.request.sampling_params import SamplingParams

W, G, K, R, S, F = (
    ReqStatus.WAITING,
    ReqStatus.WAITING_FOR_GRAMMAR,
    ReqStatus.WAITING_FOR_KV,
    ReqStatus.RUNNING,
    ReqStatus.SENDING,
    ReqStatus.FINISHED,
)


@pytest.fixture
def paths(monkeypatch):
    """rid -> the status paths of its Reqs (one per Req object: a disaggregated request has one on
    each server), each in order, its first status included."""
    by_req: dict[int, list[ReqStatus]] = {}
    seen: dict[str, list[list[ReqStatus]]] = defaultdict(list)
    move_to = Req.move_to

    def recording(self, status):
        if id(self) not in by_req:
            by_req[id(self)] = [self.status]
            seen[self.rid].append(by_req[id(self)])
        move_to(self, status)
        by_req[id(self)].append(status)

    monkeypatch.setattr(Req, "move_to", recording)
    return seen


def test_a_transition_the_lifecycle_lacks_is_refused():
    req = Req("r", [1, 2], SamplingParams())
    with pytest.raises(AssertionError, match="WAITING -> SENDING"):
        req.move_to(S)
    req.end(FinishReason.abort("gone"))
    with pytest.raises(AssertionError, match="FINISHED -> RUNNING"):
        req.move_to(R)


def test_plain_requests_wait_run_and_finish_and_the_preempted_ones_wait_again(paths):
    s = make(page_size=1, num_tokens=160, chunk=64)  # 8 x (20 + 60) tokens outgrow the pool
    prompts = {str(i): [(7 * i + k) % (VOCAB - 1) + 1 for k in range(20)] for i in range(8)}
    for rid, p in prompts.items():
        submit(s, rid, p, max_new_tokens=60, ignore_eos=True)
    outs = drain(s)
    assert s.stats.num_preemptions > 0
    for rid, p in prompts.items():
        assert ids(outs, rid) == reference_output(p, 60, VOCAB, None)
        (path,) = paths[rid]
        assert path[0] == W and path[-1] == F and path.count(F) == 1
        assert all(pair in {(W, R), (R, W), (R, F)} for pair in zip(path, path[1:])), path
    assert any(path.count(R) > 1 for (path,) in paths.values())  # someone ran again after waiting


def test_a_constrained_request_waits_for_its_grammar_first(paths):
    compile_done = concurrent.futures.Future()

    class Backends:
        def for_kind(self, kind):
            return self

        def request(self, kind, spec):
            return compile_done

        def built(self):
            return []

    s = Scheduler(ServerConfig(page_size=1), FakeRunner(400, vocab_size=VOCAB), Backends())
    s.add_request(
        TokenizedGenerateReq(
            rid="g", input_ids=[1, 2, 3], sampling_params={"regex": "a+", "max_new_tokens": 2}
        )
    )
    (req,) = s.waiting
    assert req.status is G and not s.step()  # nothing runs while it compiles
    s.check_integrity()
    compile_done.set_exception(ValueError("the regex is refused"))
    s.step()
    (out,) = s.take_outputs()
    assert out.error_status == 400 and paths["g"] == [[G, F]]
    s.check_integrity()


def test_a_beam_search_root_waits_runs_and_finishes_once(paths):
    s = make(page_size=4, num_tokens=2000, chunk=64, max_running=8)
    submit(s, "b", list(range(1, 20)), beam_width=3, max_new_tokens=6)
    outs = drain(s)
    assert outs["b"][-1].finished_reason is not None
    (root,) = paths["b"]
    assert root[0] == W and root[-1] == F and root.count(F) == 1
    beams = [rid for rid in paths if rid.startswith("b/beam")]
    assert beams and all(paths[rid] == [[W, R, F]] for rid in beams)


def test_both_halves_of_disaggregation_take_their_detours(paths):
    p, d, transfer = make_pair()
    submit_both(p, d, "x", list(range(1, 30)), room=3)
    outs = run_pair(p, d, transfer)
    assert ids(outs, ("decode", "x")) == reference_output(list(range(1, 30)), 12, VOCAB, eos=0)
    # one rid, a Req on each server: the prefill one hands its KV over, the decode one waits for it
    assert sorted(paths["x"], key=len) == [[W, K, R, F], [W, R, S, R, F]]


def test_the_options_reach_the_req_unchanged_through_the_wire():
    options = RequestOptions(
        stream=True,
        return_logprob=True,
        logprob_start_len=1,
        top_logprobs_num=2,
        program_id="prog",
        pin_ttl_s=30.0,
        session_id="chat",
        cache_salt="tenant",
        bootstrap=Bootstrap("h", 9000, 7),
    )
    msg = decode(encode(TokenizedGenerateReq(rid="o", input_ids=[1, 2, 3], sampling_params={},
                                             options=options)))  # fmt: skip
    assert msg.options == options
    s = make()
    s.add_request(msg)
    (req,) = s.waiting
    assert req.options is msg.options and req.logprob_start == 1


@pytest.mark.parametrize(
    "options, field",
    [
        ({"stream": "yes"}, "options.stream"),
        ({"top_logprobs_num": True}, "options.top_logprobs_num"),
        ({"session_id": ["a"]}, "options.session_id"),
        ({"bootstrap": {"host": "h", "port": "8998", "room": 1}}, "options.bootstrap"),
        ({"evil": 1}, "options"),
    ],
)
def test_malformed_options_on_the_wire_are_refused_for_their_rid_and_the_scheduler_goes_on(
    options, field
):
    """A TokenizedGenerateReq whose options are of the wrong shape fails to decode as a
    MalformedRequest that still names its rid, so the scheduler answers it with a 400 naming the
    field (a bare decode failure would leave it unanswered)."""
    import msgspec

    from radixrt.runtime.messages import MalformedRequest

    body = {"rid": "bad", "input_ids": [1, 2, 3], "sampling_params": {}, "options": options}
    with pytest.raises(MalformedRequest) as refused:
        decode(msgspec.msgpack.encode({"type": "TokenizedGenerateReq", **body}))
    assert refused.value.rid == "bad" and field in str(refused.value), refused.value
    s = make()
    s.refuse(refused.value.rid, refused.value)
    (out,) = s.take_outputs()
    assert out.rid == "bad" and out.error_status == 400 and field in out.error, out.error
    submit(s, "ok", [1, 2, 3], max_new_tokens=4, ignore_eos=True)
    assert ids(drain(s), "ok") == reference_output([1, 2, 3], 4, VOCAB, None)
    s.check_integrity()
