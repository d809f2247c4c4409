"""What crosses a process boundary is typed (messages.py, core/plan.py's ForwardItem): every message
survives the wire unchanged, a field of another type or an unknown tag or field is refused naming
it, and a generate request that fails so is still answered for its rid by the scheduler process."""

from __future__ import annotations

import msgspec
import pytest
import zmq
from fake_runner import reference_output
from test_scheduler import VOCAB, make

from radixrt.runtime import messages
from radixrt.runtime.core.plan import PlanItem, decode_forward, encode_forward
from radixrt.runtime.request.options import Bootstrap, RequestOptions
from radixrt.runtime.serving.backend.scheduler_process import SchedulerLoop

SAMPLES = [
    messages.TokenizedGenerateReq(
        rid="r",
        input_ids=[1, 2, 3],
        sampling_params={"temperature": 0.0, "stop": ["x"]},
        options=RequestOptions(
            stream=True,
            pin_ttl_s=2.5,
            bootstrap=Bootstrap("h", 8998, 2**63),
            reasoning_end_ids=(7, 8),
            client="c",
        ),
        arrival_time=1.5,
    ),
    messages.TokenOut(
        rid="r",
        new_ids=[4],
        finished_reason={"type": "stop", "matched": 4},
        output_logprobs=[[-0.5, 4]],
        output_top_logprobs=[[[-0.5, 4], [-1.0, 5]]],
        beams=[{"output_ids": [4], "score": -0.5}],
    ),
    messages.BatchTokenOut(outputs=[messages.TokenOut(rid="a", new_ids=[])]),
    messages.BatchTextOut(outputs=[messages.TextOut(rid="a", new_ids=[9], text="é")]),
    messages.GetCacheTreeReq(max_depth=3, max_nodes=10),
    messages.LoraAdapterOut(success=False, message="no", adapters=["x"]),
    messages.CloseSessionReq(session_id="s", cache_salt=None),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_unchanged(msg):
    assert messages.decode(messages.encode(msg)) == msg


@pytest.mark.parametrize(
    "raw, named",
    [
        ({"type": "NoSuchMessage"}, "NoSuchMessage"),
        ({"type": "AbortReq", "rid": 5}, "$.rid"),
        ({"type": "AbortReq", "rid": "a", "extra": 1}, "extra"),
        ({"type": "GetCacheTreeReq", "max_depth": True, "max_nodes": 1}, "$.max_depth"),
        ({"type": "BatchTokenOut", "outputs": [{"rid": "a"}]}, "new_ids"),
        ({"type": "TokenizedGenerateReq", "input_ids": [1]}, "rid"),  # no rid: nobody to answer
    ],
)
def test_a_malformed_message_is_refused_naming_the_field(raw, named):
    with pytest.raises(ValueError, match="malformed") as refused:
        messages.decode(msgspec.msgpack.encode(raw))
    assert not isinstance(refused.value, messages.MalformedRequest)
    assert named in str(refused.value)


def test_the_forward_plan_crosses_to_other_ranks_with_its_forward_fields_only():
    item = PlanItem(
        row=3,
        new_ids=[5, 6],
        computed_len=10,
        slots=[10, 11],
        write_start=10,
        logits_start=9,
        num_draft=1,
        page_copies=((1, 2),),
        prompt_ids=[1, 2],  # scoring input stays on rank 0
        lora="adapter",
    )
    (back,) = decode_forward(encode_forward([item]))
    forward = ("row", "new_ids", "computed_len", "slots", "write_start", "logits_start")
    assert all(getattr(back, f) == getattr(item, f) for f in forward)
    assert back.num_draft == 1 and back.page_copies == ((1, 2),)
    assert back.prompt_ids == [] and back.lora is None and back.picks == ()
    with pytest.raises(msgspec.ValidationError):
        decode_forward(msgspec.msgpack.encode([[3, [5], "10", [10], 10, None, 0, []]]))


def test_the_scheduler_process_answers_a_malformed_request_and_serves_the_next():
    ctx = zmq.Context.instance()
    socks = {}
    for name in ("pull", "detok", "tok"):
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind(f"inproc://typed-{name}")
        b.connect(f"inproc://typed-{name}")
        socks[name] = (a, b)
    s = make()
    loop = SchedulerLoop(s, socks["pull"][0], socks["detok"][0], socks["tok"][0])
    bad = {"rid": "bad", "input_ids": [1, 2], "sampling_params": {}, "options": {"stream": "yes"}}
    socks["pull"][1].send(msgspec.msgpack.encode({"type": "TokenizedGenerateReq", **bad}))
    good = messages.TokenizedGenerateReq(
        rid="ok", input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4, "ignore_eos": True}
    )
    socks["pull"][1].send(messages.encode(good))
    loop.drain(timeout_ms=1000)
    outs = []
    while s.has_work():
        s.step()
        loop.send_outputs(s.take_outputs())
    while socks["detok"][1].poll(0):
        msg = messages.decode(socks["detok"][1].recv())
        outs += msg.outputs if isinstance(msg, messages.BatchTokenOut) else []
    (refused,) = [o for o in outs if o.rid == "bad"]
    assert refused.error_status == 400 and "options.stream" in refused.error
    assert [i for o in outs if o.rid == "ok" for i in o.new_ids] == reference_output(
        [1, 2, 3], 4, VOCAB, None
    )
    s.check_integrity()
    for a, b in socks.values():
        a.close(linger=0)
        b.close(linger=0)
