"""Prefill-decode disaggregation in the scheduler (its KV roles, core/kv_roles_pd.py), on two fake
runners joined by an in-memory KV transfer that moves the fake "KV" (position, token) of the pages the decode scheduler
registered.

Truth: `reference_output` from the token ids alone; the decode runner asserts every prefix slot it
reads holds that request's token at that position (so a page sent to the wrong place, a wrong start
page or a missing page shows up), and it must never be fed a prompt token.
"""

import random

import pytest
from fake_runner import FakeRunner, reference_output
from test_scheduler import VOCAB, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.option_checks import check_bootstrap, check_disaggregated
from radixrt.runtime.request.options import Bootstrap, RequestOptions
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.request.sampling_params import SamplingParams


class MemoryTransfer:
    """Both ends of a KV transfer in one process; pump() does what the agents do."""

    def __init__(self, src_runner, dst_runner, page_size):
        self.src, self.dst, self.page_size = src_runner, dst_runner, page_size
        self.sends, self.regs, self.ended = {}, {}, {}
        self.prefill_events, self.decode_events = [], []
        self.registered = []  # (room, start page, pages) of each registration
        self.moved_pages = 0

    # prefill end
    def send(self, room, page_ids, first):
        if room in self.ended:
            self.prefill_events.append(KVSent(room, error=self.ended[room]))
        else:
            self.sends[room] = (list(page_ids), first)

    def drop(self, room, error):
        self.ended[room] = error
        if self.sends.pop(room, None) is not None:
            self.prefill_events.append(KVSent(room, error=error))
        if self.regs.pop(room, None) is not None:
            self.decode_events.append(KVFailed(room, f"prefill: {error}"))

    # decode end
    def expect(self, bootstrap, page_ids, start_page):
        room = bootstrap.room
        self.registered.append((room, start_page, list(page_ids)))
        if room in self.ended:
            self.decode_events.append(KVFailed(room, self.ended[room]))
        else:
            self.regs[room] = (list(page_ids), start_page)

    def cancel(self, bootstrap):
        room = bootstrap.room
        self.ended[room] = "cancelled by the decode server"
        if self.sends.pop(room, None) is not None:
            self.prefill_events.append(KVSent(room, error="cancelled by the decode server"))
        if self.regs.pop(room, None) is not None:
            self.decode_events.append(KVFailed(room, "cancelled"))

    def pump(self):
        for room in [r for r in self.sends if r in self.regs]:
            (src_pages, first), (dst_pages, start) = self.sends.pop(room), self.regs.pop(room)
            assert len(src_pages) - start == len(dst_pages)
            ps = self.page_size
            for s, d in zip(src_pages[start:], dst_pages):
                for off in range(ps):
                    got = self.src.kv.get(s * ps + off)
                    if got is None:
                        self.dst.kv.pop(d * ps + off, None)
                    else:
                        self.dst.kv[d * ps + off] = got
            self.moved_pages += len(dst_pages)
            n = len(dst_pages)
            self.prefill_events.append(KVSent(room, num_pages=n, num_bytes=n))
            self.decode_events.append(KVArrived(room, first, num_pages=n, num_bytes=n))

    def events_for(self, mode):
        out = self.prefill_events if mode == "prefill" else self.decode_events
        got = list(out)
        out.clear()
        return got

    def close(self):
        pass

    alive = True


class End:
    """One scheduler's view of the MemoryTransfer."""

    def __init__(self, transfer, mode):
        self.transfer, self.mode = transfer, mode

    def __getattr__(self, name):
        return getattr(self.transfer, name)

    def events(self):
        return self.transfer.events_for(self.mode)

    @property
    def alive(self):
        return self.transfer.alive


# what a PD server needs to start: the pair's secret, and on a decode server its prefill servers
PD_TRUST = dict(
    disaggregation_secret="s" * 16,
    disaggregation_channel_secret="c" * 16,
    disaggregation_prefill_addrs=("h:8998",),
)


def make_pair(page_size=4, num_tokens=800):
    runners, scheds = {}, {}
    for mode in ("prefill", "decode"):
        runners[mode] = FakeRunner(num_tokens // page_size, page_size, VOCAB, eos=0, max_rows=17)
    transfer = MemoryTransfer(runners["prefill"], runners["decode"], page_size)
    for mode in ("prefill", "decode"):
        cfg = ServerConfig(
            page_size=page_size, chunked_prefill_size=32, disaggregation_mode=mode, **PD_TRUST
        )
        scheds[mode] = Scheduler(cfg, runners[mode], kv_transfer=End(transfer, mode))
    return scheds["prefill"], scheds["decode"], transfer


def submit_both(p, d, rid, prompt, room, max_new=12, only=("prefill", "decode")):
    outs = []
    for s, mode in ((p, "prefill"), (d, "decode")):
        if mode in only:
            msg = TokenizedGenerateReq(
                rid=rid,
                input_ids=prompt,
                sampling_params={"max_new_tokens": max_new},
                options=RequestOptions(bootstrap=Bootstrap("127.0.0.1", 8998, room)),
            )
            s.add_request(msg)
            outs += s.take_outputs()
    return outs


def run_pair(p, d, transfer, outs=None, max_steps=5000):
    outs = {} if outs is None else outs
    for _ in range(max_steps):
        busy = False
        for s in (p, d):
            busy |= s.poll_transfers()
            if s.has_work():
                s.step()
                busy = True
            for o in s.take_outputs():
                outs.setdefault((s.role.name, o.rid), []).append(o)
            s.check_integrity()
        transfer.pump()
        if not busy and not (p.role.held() or d.role.held()):
            return outs
    raise AssertionError("the pair did not finish")


def prompts(rng, n=12):
    shared = [rng.randrange(1, VOCAB) for _ in range(13)]
    out = []
    for i in range(n):
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 20))]
        out.append(shared + tail if i % 2 else tail + shared)
    return out


def test_outputs_match_the_reference_and_the_decode_side_computes_no_prompt():
    p, d, transfer = make_pair()
    rng = random.Random(7)
    ps = prompts(rng)
    for i, prompt in enumerate(ps):
        submit_both(p, d, f"r{i}", prompt, room=1000 + i)
    outs = run_pair(p, d, transfer)
    for i, prompt in enumerate(ps):
        want = reference_output(prompt, 12, VOCAB, eos=0)
        assert ids(outs, ("decode", f"r{i}")) == want, i
        assert outs[("prefill", f"r{i}")][-1].finished_reason is not None
    assert d.stats.prompt_tokens_computed == 0
    assert p.stats.prompt_tokens_computed > 0
    assert d.stats.kv_transfers == p.stats.kv_transfers == len(ps)
    assert d.stats.kv_transfer_pages == p.stats.kv_transfer_pages == transfer.moved_pages
    for s in (p, d):  # everything back: free + the trees, nothing held
        s.check_integrity()
        assert not s.role.held() and s.admin.flush_cache()


def test_only_the_pages_the_decode_tree_lacks_travel():
    p, d, transfer = make_pair(page_size=4)
    rng = random.Random(3)
    first = [rng.randrange(1, VOCAB) for _ in range(21)]
    submit_both(p, d, "a", first, room=1)
    outs = run_pair(p, d, transfer)
    turn = first + ids(outs, ("decode", "a")) + [rng.randrange(1, VOCAB) for _ in range(9)]
    submit_both(p, d, "b", turn, room=2)
    outs = run_pair(p, d, transfer, outs)
    assert ids(outs, ("decode", "b")) == reference_output(turn, 12, VOCAB, eos=0)
    room, start, pages = transfer.registered[-1]
    # the decode server's tree holds the first turn (prompt + output, whole pages): only the rest
    cached = (len(first) + 12) // 4 * 4
    assert start == cached // 4
    assert len(pages) == -(-len(turn) // 4) - start
    assert outs[("decode", "b")][-1].cached_tokens >= cached - 4


def test_a_decode_abort_while_the_kv_is_in_flight_frees_pages_on_both_sides():
    p, d, transfer = make_pair()
    prompt = list(range(1, 30))
    submit_both(p, d, "x", prompt, room=5, only=("decode",))
    for _ in range(3):  # registered; the prefill server has not seen the request yet
        d.step()
        d.poll_transfers()
    assert d.role.held()
    d.abort("x")
    assert not d.take_outputs() and d.role.held()  # held until the transfer lets go of its pages
    outs = run_pair(p, d, transfer)
    assert outs[("decode", "x")][-1].finished_reason["type"] == "abort"
    submit_both(p, d, "x", prompt, room=5, only=("prefill",))  # the late half
    outs = run_pair(p, d, transfer, outs)
    assert "cancelled" in outs[("prefill", "x")][-1].finished_reason["message"]
    for s in (p, d):
        s.check_integrity()
        assert s.admin.flush_cache()


def test_a_request_the_prefill_server_refuses_fails_on_the_decode_side():
    p, d, transfer = make_pair()
    submit_both(p, d, "ok", [1, 2, 3], room=9)
    bad = TokenizedGenerateReq(
        rid="bad",
        input_ids=[1, 2, VOCAB + 5],  # out of the vocabulary: refused at intake
        sampling_params={"max_new_tokens": 4},
        options=RequestOptions(bootstrap=Bootstrap("h", 8998, 10)),
    )
    p.add_request(bad)
    refusal = p.take_outputs()
    assert refusal and refusal[0].finished_reason["type"] == "abort"
    d.add_request(
        TokenizedGenerateReq(
            rid="bad",
            input_ids=[1, 2, 3, 4],
            sampling_params={"max_new_tokens": 4},
            options=RequestOptions(bootstrap=Bootstrap("h", 8998, 10)),
        )
    )
    outs = run_pair(p, d, transfer)
    err = outs[("decode", "bad")][-1]
    assert err.finished_reason["type"] == "abort" and err.error_status == 500
    assert ids(outs, ("decode", "ok")) == reference_output([1, 2, 3], 12, VOCAB, eos=0)
    for s in (p, d):
        s.check_integrity()


def test_a_disaggregated_scheduler_refuses_requests_without_a_room():
    p, d, _ = make_pair()
    for s in (p, d):
        s.add_request(TokenizedGenerateReq(rid="plain", input_ids=[1, 2], sampling_params={}))
        out = s.take_outputs()
        assert out[0].finished_reason["type"] == "abort"
        assert "bootstrap_room" in out[0].finished_reason["message"]


def test_a_stopped_transfer_fails_what_it_held_instead_of_hanging():
    p, d, transfer = make_pair()
    submit_both(p, d, "y", list(range(1, 20)), room=11, only=("decode",))
    for _ in range(2):
        d.step()
    assert d.role.held()
    transfer.alive = False
    d.poll_transfers()
    (out,) = d.take_outputs()
    assert out.error_status == 500 and "transfer agent stopped" in out.error
    assert not d.role.held()
    d.check_integrity()


def test_settings_disaggregation_cannot_serve_are_refused_by_name():
    import pytest

    from radixrt.runtime.engine.engine import Engine

    with pytest.raises(ValueError, match="--tp-size 1 and --dp-size 1"):
        ServerConfig(disaggregation_mode="decode", tp_size=2)
    with pytest.raises(ValueError, match="disaggregation_mode must be one of"):
        ServerConfig(disaggregation_mode="both")
    with pytest.raises(ValueError, match="leave --disaggregation-mode out"):
        ServerConfig(disaggregation_mode="prefill", pd="1p1d")
    with pytest.raises(ValueError, match="not by the in-process Engine"):
        Engine(disaggregation_mode="prefill", **PD_TRUST)
    with pytest.raises(ValueError, match="needs --disaggregation-secret"):
        ServerConfig(disaggregation_mode="prefill", disaggregation_secret="short")
    with pytest.raises(ValueError, match="needs --disaggregation-channel-secret"):
        ServerConfig(disaggregation_mode="prefill", disaggregation_secret="s" * 16)
    for taken in (
        "disaggregation_secret",
        "api_key",
        "admin_api_key",
    ):  # the router's, the clients'
        with pytest.raises(ValueError, match="channel_secret must differ"):
            ServerConfig(**{**PD_TRUST, taken: "c" * 16}, disaggregation_mode="prefill")
    with pytest.raises(ValueError, match="needs --disaggregation-prefill-addrs"):
        ServerConfig(
            disaggregation_mode="decode",
            disaggregation_secret="s" * 16,
            disaggregation_channel_secret="c" * 16,
        )
    with pytest.raises(ValueError, match="mooncake is refused"):
        ServerConfig(
            **PD_TRUST, disaggregation_mode="decode", disaggregation_transfer_backend="mooncake"
        )
    with pytest.raises(ValueError, match="--pd 1p1d needs --api-key"):
        ServerConfig(pd="1p1d")
    cfg = ServerConfig(
        **{**PD_TRUST, "disaggregation_prefill_addrs": ("a", "b:9")}, disaggregation_mode="decode"
    )
    assert cfg.prefill_bootstrap_addrs == ("a:8998", "b:9")


def test_the_request_edge_names_the_bootstrap_field_at_fault():
    addrs = dict(prefill_addrs=("h:8998",))
    ok = dict(num_prompts=1, n=1, logprob_start_len=None)

    def check_disaggregated_of(mode, boot, num_prompts, n, logprob_start_len):
        options = RequestOptions(
            bootstrap=boot,
            return_logprob=logprob_start_len is not None,
            logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
        )
        check_disaggregated(mode, options, SamplingParams.from_dict({"n": n}), num_prompts)

    assert check_bootstrap("null", None, None, None, **addrs) is None  # ignored, as SGLang does
    assert check_bootstrap("decode", "h", None, 2**64 - 1, **addrs).room == 2**64 - 1
    assert check_bootstrap("decode", "h", 8998, 1, **addrs).port == 8998
    assert check_bootstrap("prefill", "anything", 5, 1, **addrs).room == 1
    cases = [
        (("decode", "evil", None, 3), ok, "bootstrap_host"),
        (("decode", "h", 8999, 3), ok, "bootstrap_host"),
        (("decode", "!", None, 3), ok, "bootstrap_host"),
        (("decode", "h", None, None), ok, "bootstrap_room"),
        (("prefill", None, 8998, 3), ok, "bootstrap_host"),
        (("decode", "h", None, 2**64), ok, "bootstrap_room"),
        (("decode", "h", 0, 3), ok, "bootstrap_port"),
        (("decode", "h", None, 3), {**ok, "n": 2}, "n"),
        (("decode", "h", None, 3), {**ok, "num_prompts": 2}, "bootstrap_room"),
        (("prefill", "h", None, 3), {**ok, "logprob_start_len": 0}, "logprob_start_len"),
    ]
    for args, kwargs, field in cases:
        with pytest.raises(RequestError) as e:
            boot = check_bootstrap(*args, **addrs)
            check_disaggregated_of(args[0], boot, **kwargs)
        assert e.value.param == field, (args, kwargs)
    check_disaggregated_of("null", None, **{**ok, "n": 2})
    with pytest.raises(RequestError) as e:
        check_disaggregated_of("decode", None, **ok)  # options built without a bootstrap
    assert e.value.param == "bootstrap_room" and "bootstrap_room is required" in str(e.value)
    assert check_bootstrap("decode", "h", None, 3, **addrs) == Bootstrap("h", 8998, 3)


def test_a_second_request_naming_a_room_in_use_is_refused_and_the_first_goes_on():
    p, d, transfer = make_pair()
    submit_both(p, d, "first", [5, 6, 7, 8, 9], room=21)
    dup = submit_both(p, d, "second", [1, 2], room=21)
    assert len(dup) == 2 and all("already in use" in o.error for o in dup)
    outs = run_pair(p, d, transfer)
    assert ids(outs, ("decode", "first")) == reference_output([5, 6, 7, 8, 9], 12, VOCAB, eos=0)
