"""Scheduler behaviour on a fake runner whose outputs are a pure function of the tokens.

Truth: `reference_output` computed from token ids alone; the fake runner also asserts that
every prefix slot it reads holds that request's own token (see tests/fake_runner.py).
"""

import random

import pytest
from fake_runner import FakeDraftGrammar, FakeRunner, reference_output
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions

VOCAB = 50


def make(page_size=1, num_tokens=400, chunk=32, disable=False, max_running=16, eos=0):
    cfg = ServerConfig(
        page_size=page_size,
        chunked_prefill_size=chunk,
        disable_radix_cache=disable,
        max_running_requests=max_running,
    )
    return Scheduler(
        cfg,
        FakeRunner(
            num_pages=num_tokens // page_size,
            page_size=page_size,
            vocab_size=VOCAB,
            eos=eos,
            max_rows=max_running + 1,
        ),
    )


def submit(s, rid, prompt, **params):
    params.setdefault("max_new_tokens", 16)
    s.add_request(TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=params))
    return s.take_outputs()


def drain(s, outs=None, max_steps=10_000):
    outs = {} if outs is None else outs
    for _ in range(max_steps):
        if not s.has_work():
            return outs
        s.step()
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
        s.check_integrity()
    raise AssertionError("scheduler did not finish")


def drain_aborting(s, rng, rids, num_abort, at_step):
    """drain, aborting num_abort of rids (drawn with rng) after step at_step: (outs, aborted)."""
    outs, aborted, steps = {}, set(), 0
    while s.has_work():
        s.step()
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
        s.check_integrity()
        steps += 1
        if steps == at_step and num_abort:
            for rid in rng.sample(sorted(rids), num_abort):
                aborted.add(rid)
                s.abort(rid)
                for o in s.take_outputs():
                    outs.setdefault(o.rid, []).append(o)
        assert steps < 5000
    return outs, aborted


def ids(outs, rid):
    return [t for o in outs[rid] for t in o.new_ids]


def assert_all_pages_back(s):
    assert s.admin.flush_cache()
    s.check_integrity()
    assert s.memory.allocator.num_free == s.memory.allocator.num_pages


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("num_tokens", [2000, 256])
@pytest.mark.parametrize("disable", [False, True])
def test_outputs_match_reference_under_sharing_chunking_and_preemption(
    page_size, num_tokens, disable
):
    rng = random.Random(page_size * 7 + num_tokens)
    s = make(page_size, num_tokens, chunk=48, disable=disable)
    shared = [rng.randrange(1, VOCAB) for _ in range(60)]
    prompts = {}
    for i in range(14):
        p = (shared if i % 3 else []) + [
            rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))
        ]
        prompts[str(i)] = p
        submit(s, str(i), p, max_new_tokens=24)
    outs = drain(s)
    for rid, p in prompts.items():
        assert ids(outs, rid) == reference_output(p, 24, VOCAB, 0), rid
        assert outs[rid][-1].finished_reason["type"] in ("stop", "length")
    assert_all_pages_back(s)


def run_preempting_batch(s, rng, prompt_len: int, new_tokens: int) -> None:
    """8 requests whose decodes outgrow the pool: preemption must happen and leave every output unchanged."""
    prompts = {str(i): [rng.randrange(1, VOCAB) for _ in range(prompt_len)] for i in range(8)}
    for rid, p in prompts.items():
        submit(s, rid, p, max_new_tokens=new_tokens, ignore_eos=True)
    outs = drain(s)
    assert s.stats.num_preemptions > 0, "the small pool should have forced preemption"
    for rid, p in prompts.items():
        assert ids(outs, rid) == reference_output(p, new_tokens, VOCAB, None), (
            rid
        )  # ignore_eos: no stop at 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_preemption_when_decode_outgrows_the_pool_leaves_outputs_unchanged(page_size):
    s = make(page_size, num_tokens=160, chunk=64)
    run_preempting_batch(s, random.Random(3), prompt_len=20, new_tokens=60)
    assert_all_pages_back(s)


def test_in_batch_prefix_sharing_computes_shared_prefix_once():
    s = make(page_size=1, num_tokens=4000, chunk=512)
    rng = random.Random(1)
    shared = [rng.randrange(1, VOCAB) for _ in range(200)]
    for i in range(10):
        submit(s, str(i), shared + [rng.randrange(1, VOCAB) for _ in range(5)], max_new_tokens=1)
    drain(s)
    # one request prefills 205 tokens, the other nine only their 5-token tails (+ the last shared token)
    assert s.runner.forward_tokens <= 205 + 9 * 6, s.runner.forward_tokens
    assert s.admin.server_info()["cached_tokens"] >= 9 * 199


def test_prefix_reuse_across_requests_reports_cached_tokens():
    s = make(page_size=4, num_tokens=1000)
    p = list(range(1, 41))
    submit(s, "a", p, max_new_tokens=4)
    first = drain(s)
    submit(s, "b", p + [3, 4, 5], max_new_tokens=4)
    second = drain(s)
    assert first["a"][-1].cached_tokens == 0
    assert second["b"][-1].cached_tokens == 40  # page aligned: 40 is a multiple of 4
    assert ids(second, "b") == reference_output(p + [3, 4, 5], 4, VOCAB, 0)


def test_abort_frees_pages_at_once():
    s = make(num_tokens=500)
    submit(s, "x", list(range(1, 30)), max_new_tokens=200, ignore_eos=True)
    submit(s, "y", list(range(5, 30)), max_new_tokens=200, ignore_eos=True)
    for _ in range(5):
        s.step()
        s.take_outputs()  # this step's outputs are not looked at
    s.abort("x")
    outs = s.take_outputs()
    assert outs[-1].finished_reason["type"] == "abort"
    s.check_integrity()
    s.abort("y")
    outs = s.take_outputs()
    assert not s.running and not s.waiting
    assert_all_pages_back(s)


def test_finish_reasons_stop_ids_length_and_ignore_eos():
    s = make(eos=None)
    p = [1, 2, 3]
    ref = reference_output(p, 30, VOCAB, None)
    submit(s, "len", p, max_new_tokens=5)
    submit(s, "stopid", p, max_new_tokens=30, stop_token_ids=[ref[3]])
    outs = drain(s)
    assert outs["len"][-1].finished_reason == {"type": "length", "length": 5}
    assert ids(outs, "stopid") == ref[: ref.index(ref[3]) + 1]
    assert outs["stopid"][-1].finished_reason == {"type": "stop", "matched": ref[3]}


def test_stop_string_finishes_request():
    s = make(eos=None)
    p = [1, 2, 3]
    ref = reference_output(p, 30, VOCAB, None)
    text = s.tokenizer.decode(ref)
    stop = text[6:8]
    submit(s, "s", p, max_new_tokens=30, stop=[stop])
    outs = drain(s)
    got = s.tokenizer.decode(ids(outs, "s"))
    assert outs["s"][-1].finished_reason == {"type": "stop", "matched": stop}
    assert got.find(stop) == len(got) - len(stop) == text.find(stop)


@pytest.mark.parametrize(
    "prompt,params,needle",
    [
        ([], {}, "empty"),
        ([1, 2, VOCAB + 5], {}, "input_ids"),
        (list(range(1, 40)) * 3, {"max_new_tokens": 400}, "can never run"),
        ([1, 2], {"temperature": -1}, "temperature"),
        ([1, 2], {"bogus": 1}, "bogus"),
    ],
)
def test_bad_requests_are_answered_not_raised(prompt, params, needle):
    s = make(num_tokens=200)
    outs = submit(s, "bad", prompt, **params)
    assert outs[0].finished_reason["type"] == "abort" and needle in outs[0].error
    assert not s.has_work()
    s.check_integrity()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    pool_pages=st.integers(8, 80),
    chunk_pages=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    num_reqs=st.integers(1, 24),
    disable=st.booleans(),
    drafts=st.booleans(),
)
def test_fuzz_random_arrivals_aborts_and_sizes(
    page_size, pool_pages, chunk_pages, seed, num_reqs, disable, drafts
):
    """drafts: jump-forward drafts, partly wrong, on every request (their KV past the kept part is garbage
    the fake runner would catch if it were ever read as a request's own)."""
    rng = random.Random(seed)
    pool_tokens = pool_pages * 16
    s = make(page_size, pool_tokens, chunk=page_size * chunk_pages, disable=disable, max_running=6)
    bases = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))] for _ in range(3)]
    pending, prompts, aborted, outs = [], {}, set(), {}
    for i in range(num_reqs):
        p = rng.choice(bases)[: rng.randrange(1, 40)] + [
            rng.randrange(1, VOCAB) for _ in range(rng.randrange(0, 12))
        ]
        max_new = rng.randrange(1, 20)
        pending.append((rng.randrange(0, 30), str(i), p, max_new))
    step = 0
    while pending or s.has_work():
        for item in [x for x in pending if x[0] <= step]:
            pending.remove(item)
            _, rid, p, max_new = item
            prompts[rid] = (p, max_new)
            for o in submit(s, rid, p, max_new_tokens=max_new):
                outs.setdefault(o.rid, []).append(o)
            if drafts:
                attach_drafts(s, rid, rng)
        if s.has_work() and rng.random() < 0.05:
            rid = rng.choice(list(prompts))
            aborted.add(rid)
            s.abort(rid)
            for o in s.take_outputs():
                outs.setdefault(o.rid, []).append(o)
        s.step()
        for o in s.take_outputs():
            outs.setdefault(o.rid, []).append(o)
        s.check_integrity()
        step += 1
        assert step < 5000, "no progress"
    for rid, (p, max_new) in prompts.items():
        assert outs[rid][-1].finished_reason is not None, f"request {rid} lost"
        if len(p) + max_new > pool_tokens:
            assert outs[rid][-1].finished_reason["type"] == "abort"
        elif rid not in aborted:
            assert ids(outs, rid) == reference_output(p, max_new, VOCAB, 0)
    assert_all_pages_back(s)


def attach_drafts(s, rid, rng, wrong=0.3):
    for req in s.waiting:
        if req.rid == rid:
            req.grammar = FakeDraftGrammar(req, VOCAB, rng, wrong)


@pytest.mark.parametrize("page_size", [1, 4])
def test_drafts_keep_outputs_and_save_forwards(page_size):
    """Right drafts save forwards; wrong ones cost none of the output; pages all come back."""
    rng = random.Random(page_size)
    prompts = {
        str(i): [rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 30))] for i in range(6)
    }
    forwards = {}
    for wrong in (None, 0.0, 0.5):
        s = make(page_size, 2000, eos=None)
        for rid, p in prompts.items():
            submit(s, rid, p, max_new_tokens=30)
            if wrong is not None:
                attach_drafts(s, rid, rng, wrong)
        outs = drain(s)
        for rid, p in prompts.items():
            assert ids(outs, rid) == reference_output(p, 30, VOCAB, None), (wrong, rid)
            assert outs[rid][-1].finished_reason == {"type": "length", "length": 30}
        forwards[wrong] = s.runner.num_forwards
        accepted = s.stats.num_draft_accepted
        assert (accepted > 0) == (wrong is not None) and accepted <= s.stats.num_draft_tokens
        assert_all_pages_back(s)
    assert forwards[0.0] < forwards[0.5] < forwards[None], forwards


def test_rejected_drafts_give_their_pages_back_and_never_preempt():
    """Always-wrong 10-token drafts in a tight pool: a request holds no more pages than its tokens
    need after any step, and the run preempts exactly as often as without drafts."""
    prompts = {"a": list(range(1, 11)), "b": list(range(11, 21))}
    for pool in (32, 42):
        preemptions = []
        for wrong in (None, 1.0):
            s = make(1, pool, chunk=64, eos=None, max_running=4)
            for rid, p in prompts.items():
                submit(s, rid, p, max_new_tokens=11)
                if wrong is not None:
                    for req in s.waiting:
                        if req.rid == rid:
                            req.grammar = FakeDraftGrammar(
                                req, VOCAB, random.Random(pool), wrong, max_len=10
                            )
            outs = {}
            while s.has_work():
                s.step()
                for o in s.take_outputs():
                    outs.setdefault(o.rid, []).append(o)
                s.check_integrity()
                for req in s.running:
                    assert len(req.kv.page_ids) <= s.memory.allocator.pages_for(req.seq_len), req
            for rid, p in prompts.items():
                assert ids(outs, rid) == reference_output(p, 11, VOCAB, None)
            preemptions.append(s.stats.num_preemptions)
            assert_all_pages_back(s)
        assert preemptions[0] == preemptions[1], (pool, preemptions)


def test_draft_tokens_per_step_are_budgeted(monkeypatch):
    from radixrt.runtime.core import schedule_policy

    monkeypatch.setattr(schedule_policy, "MAX_DRAFT_TOKENS_PER_STEP", 7)
    rng = random.Random(3)
    s = make(1, 4000, eos=None, max_running=16)
    prompts = {str(i): [rng.randrange(1, VOCAB) for _ in range(8)] for i in range(12)}
    for rid, p in prompts.items():
        submit(s, rid, p, max_new_tokens=20)
        attach_drafts(s, rid, rng, wrong=0.0)
    run = s.runner.run
    per_step = []
    s.runner.run = lambda plan, masks: (
        per_step.append(sum(it.num_draft for it in plan)),
        run(plan, masks),
    )[1]
    outs = drain(s)
    assert max(per_step) == 7 and all(
        ids(outs, rid) == reference_output(p, 20, VOCAB, None) for rid, p in prompts.items()
    )


def test_max_new_tokens_zero_prefills_only_and_caches_the_prompt():
    s = make()
    p = list(range(1, 30))
    submit(s, "warm", p, max_new_tokens=0)
    outs = drain(s)
    assert ids(outs, "warm") == [] and outs["warm"][-1].finished_reason == {
        "type": "length",
        "length": 0,
    }
    submit(s, "use", p + [5], max_new_tokens=3)
    outs = drain(s)
    assert outs["use"][-1].cached_tokens == len(p)
    assert ids(outs, "use") == reference_output(p + [5], 3, VOCAB, 0)


def test_pins_hold_a_prefix_against_eviction_until_unpinned_or_expired():
    s = make(
        page_size=1, num_tokens=200
    )  # one pin may hold a quarter of the pool: 50 >= the 43-token prefix
    p = [7] * 5 + list(range(1, 40))
    s.add_request(
        TokenizedGenerateReq(
            rid="pin",
            input_ids=p,
            sampling_params={"max_new_tokens": 0},
            options=RequestOptions(pin_ttl_s=60),
        )
    )
    outs = drain(s)
    reason = outs["pin"][-1].finished_reason
    assert reason["pinned"] is True and len(reason["pin_handle"]) >= 20, (
        reason
    )  # unguessable, not the rid
    handle = reason["pin_handle"]
    assert s.admin.server_info()["num_pinned_tokens"] >= len(p) - 1
    # fill the pool with unrelated work: the pinned prefix must survive
    for i in range(6):
        submit(
            s,
            f"x{i}",
            [(i * 7 + k) % 40 + 10 for k in range(30)],
            max_new_tokens=20,
            ignore_eos=True,
        )
    drain(s)
    submit(s, "use", p + [3], max_new_tokens=2)
    outs = drain(s)
    assert outs["use"][-1].cached_tokens >= len(p) - 1
    assert not s.admin.flush_cache(), "a pinned prefix is locked: flush must refuse"
    assert not s.admin.unpin("pin"), "the request id is not the handle"
    assert s.admin.unpin(handle) and not s.admin.unpin(handle)
    assert_all_pages_back(s)
    # expiry: a pin whose ttl passed is released on the next step
    s.add_request(
        TokenizedGenerateReq(
            rid="short",
            input_ids=p,
            sampling_params={"max_new_tokens": 0},
            options=RequestOptions(pin_ttl_s=1e-6),
        )
    )
    drain(s)
    s.step()
    s.take_outputs()  # this step's outputs are not looked at
    assert s.admin.server_info()["num_pins"] == 0
    assert_all_pages_back(s)


def test_one_pin_is_capped_at_a_quarter_of_the_pool_and_its_ttl_is_capped():
    from radixrt.runtime.core.pins import MAX_PIN_TTL_S

    s = make(page_size=1, num_tokens=200)
    big = [(k * 3) % 40 + 5 for k in range(60)]  # 59 cached tokens > 50
    s.add_request(
        TokenizedGenerateReq(
            rid="big",
            input_ids=big,
            sampling_params={"max_new_tokens": 0},
            options=RequestOptions(pin_ttl_s=60),
        )
    )
    outs = drain(s)
    assert (
        outs["big"][-1].finished_reason["pinned"] is False
        and s.admin.server_info()["num_pins"] == 0
    )
    small = big[:40]
    s.add_request(
        TokenizedGenerateReq(
            rid="small",
            input_ids=small,
            sampling_params={"max_new_tokens": 0},
            options=RequestOptions(pin_ttl_s=1e9),
        )
    )
    outs = drain(s)
    handle = outs["small"][-1].finished_reason["pin_handle"]
    import time

    assert s.pins.expiry(handle) <= time.monotonic() + MAX_PIN_TTL_S + 1
    assert s.admin.unpin(handle)
    assert_all_pages_back(s)


@pytest.mark.parametrize("page_size", [1, 4])
def test_abort_in_the_middle_of_a_chunked_prefill(page_size):
    """A long prompt prefilled in small chunks, aborted after two of them: the abort ends it at once,
    its partial KV goes into the tree (page-aligned) or back to the pool, integrity holds, every page
    comes back, and sending it again gives the reference output."""
    s = make(page_size=page_size, num_tokens=400, chunk=16)
    rng = random.Random(page_size)
    p = [rng.randrange(1, VOCAB) for _ in range(100)]
    submit(s, "long", p, max_new_tokens=6)
    s.step()
    s.take_outputs()  # this step's outputs are not looked at
    s.step()
    s.take_outputs()  # this step's outputs are not looked at
    (req,) = s.running
    assert 0 < req.kv.computed_len < len(p) and not req.output_ids, (
        "not in the middle of its prefill"
    )
    s.abort("long")
    outs = s.take_outputs()
    assert outs[-1].finished_reason["type"] == "abort" and not s.running and not s.waiting
    s.check_integrity()
    assert s.tree.protected_pages == 0
    submit(s, "again", p, max_new_tokens=6)
    outs = drain(s)
    assert ids(outs, "again") == reference_output(p, 6, VOCAB, 0)
    assert (
        outs["again"][-1].cached_tokens == (32 // page_size) * page_size
    )  # the aborted chunks were kept
    assert_all_pages_back(s)


@pytest.mark.parametrize("chunk", [16, 512])
def test_pins_and_sessions_yield_to_a_request_that_cannot_otherwise_run(chunk):
    """A prompt that fits the pool but not the pool minus what is pinned must still run (pins let go,
    oldest first), with the reference output; before, it waited for the pins' ttl."""
    s = make(page_size=1, num_tokens=200, chunk=chunk)
    for i, sid in enumerate(["a", "b"]):  # two sessions, each pinning ~45 tokens of the 200
        prompt = [11 + i] * 5 + list(range(1, 40))
        s.add_request(
            TokenizedGenerateReq(
                rid=f"turn-{sid}",
                input_ids=prompt,
                options=RequestOptions(session_id=sid),
                sampling_params={"max_new_tokens": 2},
            )
        )
        drain(s)
    assert s.admin.server_info()["num_pins"] == 2 and s.admin.server_info()["num_sessions"] == 2
    big = [(k * 3) % 40 + 10 for k in range(150)]  # 150 + 20 > 200 - 90 pinned
    submit(s, "big", big, max_new_tokens=20, ignore_eos=True)
    outs = drain(s, max_steps=500)
    assert ids(outs, "big") == reference_output(big, 20, VOCAB, eos=None)
    info = s.admin.server_info()
    assert info["num_pins"] < 2 and info["num_sessions"] < 2  # the oldest went first
    s.sessions.clear()
    assert_all_pages_back(s)


def test_session_keeps_its_last_turn_and_counts_hits():
    s = make(page_size=4, num_tokens=400)
    prompt = [9] * 10 + list(range(1, 30))
    kept = 0
    for turn in range(3):
        s.add_request(
            TokenizedGenerateReq(
                rid=f"t{turn}",
                input_ids=prompt,
                options=RequestOptions(session_id="chat"),
                sampling_params={"max_new_tokens": 5, "ignore_eos": True},
            )
        )
        outs = drain(s)
        out = ids(outs, f"t{turn}")
        if turn:  # everything the last turn left pinned, in whole pages (the last sampled token has no KV)
            assert outs[f"t{turn}"][-1].cached_tokens == kept // 4 * 4
        for i in range(8):  # unrelated traffic fills the pool
            submit(
                s,
                f"x{turn}-{i}",
                [(i * 5 + k) % 40 + 10 for k in range(40)],
                max_new_tokens=8,
                ignore_eos=True,
            )
        drain(s)
        kept = len(prompt) + len(out) - 1
        prompt = prompt + out + [3, 4]
    info = s.admin.server_info()["sessions"]["chat"]
    assert info["turns"] == 3 and info["cached_tokens"] > 0
    assert s.admin.close_session("chat") and not s.admin.close_session("chat")
    assert_all_pages_back(s)
