"""Tenants in the scheduler (core/namespaces.py): KV is shared only between requests of the same
cache_salt. Truth: the fake runner checks every KV slot a request reads holds its own token, outputs
equal `reference_output`, and a cache hit is the scheduler's cached_tokens (exact here: the HTTP
edge rounds it, serving/http/tenants.py); integrity after every step (drain) and every page back at the
end. Every path that keys by the tree's keys is crossed with two salts: the pool, the second tier,
forks of the same prompt, pins, sessions, beams, prompt-lookup drafts, LoRA unloads, the namespace
table's bound and the cache view."""

from __future__ import annotations

import pytest
from fake_runner import FakeRunner, reference_output
from test_scheduler import VOCAB, assert_all_pages_back, drain, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.option_checks import MAX_CACHE_SALT_CHARS, check_cache_salt
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.request_error import RequestError

PROMPT = [(k * 7) % 40 + 3 for k in range(40)]


def make(page_size=1, num_tokens=400, loras=(), **cfg):
    config = ServerConfig(page_size=page_size, chunked_prefill_size=64, **cfg)
    runner = FakeRunner(
        num_tokens // page_size, page_size, VOCAB, eos=None, max_rows=17, loras=loras
    )
    return Scheduler(config, runner)


def ask(s, rid, prompt, salt=None, **fields):
    params = fields.pop("params", {})
    params.setdefault("max_new_tokens", 4)
    if "lora_path" in fields:  # the HTTP field's name for the adapter
        fields["lora"] = fields.pop("lora_path")
    options = RequestOptions(cache_salt=salt, **fields)
    s.add_request(
        TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=params, options=options)
    )
    return s.take_outputs()


def run(s, rid, prompt, salt=None, **fields):
    """One request alone, drained: (its cached tokens, its output ids)."""
    ask(s, rid, prompt, salt, **fields)
    outs = drain(s)
    return outs[rid][-1].cached_tokens, ids(outs, rid)


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_same_prompt_under_two_salts_shares_no_page(page_size):
    s = make(page_size)
    want = reference_output(PROMPT, 4, VOCAB, None)
    assert run(s, "a1", PROMPT, "tenant-a") == (0, want)
    after_a = s.tree.total_pages()
    assert run(s, "b1", PROMPT, "tenant-b") == (0, want), "salt B was served salt A's KV"
    assert s.tree.total_pages() >= 2 * after_a - 1, "B's prompt pages are not its own"
    assert run(s, "n1", PROMPT) == (0, want), "an unsalted request was served a salt's KV"
    aligned = (len(PROMPT) - 1) // page_size * page_size
    assert run(s, "a2", PROMPT, "tenant-a")[0] == aligned, "salt A's own prefix not reused"
    assert run(s, "b2", PROMPT, "tenant-b")[0] == aligned
    assert_all_pages_back(s)


def test_concurrent_copies_under_two_salts_never_fork_from_each_other():
    """At page size 4 a waiting copy of a prompt in flight forks its partial page (fork_donor):
    only from a request of its own namespace."""
    s = make(page_size=4)
    for rid, salt in (("a", "x"), ("b", "y"), ("c", "x")):
        ask(s, rid, PROMPT, salt)
    outs = drain(s)
    want = reference_output(PROMPT, 4, VOCAB, None)
    assert all(ids(outs, r) == want for r in "abc")
    assert outs["b"][-1].cached_tokens == 0, "salt y forked salt x's prompt"
    assert outs["c"][-1].cached_tokens == len(PROMPT) - 1  # its own salt's: a fork
    assert_all_pages_back(s)


def test_the_second_tier_serves_a_salt_only_its_own_kv():
    s = make(num_tokens=120, enable_hierarchical_cache=True, hicache_ratio=8.0)
    run(s, "a", PROMPT, "x")
    for i in range(6):  # unrelated traffic pushes salt x's prompt out of the pool into the tier
        run(s, f"f{i}", [(i * 11 + k) % 40 + 5 for k in range(60)])
    loaded = s.tree.tier_stats.tokens_loaded
    assert run(s, "b", PROMPT, "y")[0] == 0, "salt y was served salt x's KV from the tier"
    assert s.tree.tier_stats.tokens_loaded == loaded, "the tier loaded KV for another salt"
    for i in range(6):
        run(s, f"g{i}", [(i * 13 + k) % 40 + 5 for k in range(60)])
    cached, out = run(s, "a2", PROMPT, "x")
    assert cached == len(PROMPT) - 1 and out == reference_output(PROMPT, 4, VOCAB, None)
    assert s.tree.tier_stats.tokens_loaded > loaded, "salt x's own KV did not come back"
    s.check_integrity()
    assert s.admin.flush_cache() and s.tree.host.num_free == s.tree.host.num_pages


def test_prompt_lookup_drafts_come_from_the_request_alone():
    """A request's n-gram drafts (--speculative-algorithm ngram) are drawn from its own text: what
    another salt's request wrote before it changes neither its drafts nor its output."""
    repeat = [5, 6, 7, 8] * 6  # salt x's text: n-grams whose continuations salt y would want
    probe = [1, 2, 9, 5, 6, 7]  # ends on an n-gram salt x's text continues, never seen in probe
    params = {"max_new_tokens": 6}

    def drafts_of_probe(after_other: bool) -> tuple[int, list[int]]:
        s = make(speculative_algorithm="ngram")
        if after_other:
            run(s, "x", repeat, "x", params=dict(params))
        before = s.stats.num_draft_tokens
        _, out = run(s, "y", probe, "y", params=dict(params))
        return s.stats.num_draft_tokens - before, out

    alone = drafts_of_probe(False)
    assert drafts_of_probe(True) == alone
    assert alone[1] == reference_output(probe, 6, VOCAB, None)


def test_pins_are_in_their_salts_namespace():
    s = make()
    ask(s, "pin", PROMPT, "x", params={"max_new_tokens": 0}, pin_ttl_s=60)
    handle = drain(s)["pin"][-1].finished_reason["pin_handle"]
    assert handle
    assert run(s, "y", PROMPT + [3], "y")[0] == 0, "salt y read salt x's pinned prefix"
    assert run(s, "x", PROMPT + [3], "x")[0] == len(PROMPT)
    assert s.admin.unpin(handle)
    assert_all_pages_back(s)


def test_a_session_belongs_to_its_salt():
    s = make()
    run(s, "x1", PROMPT, "salt-x", session_id="chat")
    assert s.admin.server_info()["num_sessions"] == 1
    # salt y naming the same session has a session of its own: salt x's pin is not replaced
    run(s, "y1", PROMPT[:10], "salt-y", session_id="chat")
    info = s.admin.server_info()
    assert info["num_sessions"] == 2 and info["num_pinned_tokens"] >= len(PROMPT) + 3
    listed = sorted(info["sessions"])
    assert len(listed) == 2 and all(k.startswith("chat@") and "salt" not in k for k in listed)
    assert not s.admin.close_session("chat"), "an unsalted close named a salted session"
    assert s.admin.close_session("chat", "salt-y") and not s.admin.close_session("chat", "salt-y")
    cached, _ = run(s, "x2", PROMPT + [1, 2], "salt-x", session_id="chat")
    assert cached >= len(PROMPT), "salt x's session lost its pinned turn"
    assert s.admin.close_session("chat", "salt-x")
    assert_all_pages_back(s)


def test_beams_stay_in_their_salts_namespace():
    s = make()
    ask(s, "beam", PROMPT, "x", params={"beam_width": 3, "n": 2, "max_new_tokens": 5})
    outs = drain(s)
    assert outs["beam"][-1].beams and len(outs["beam"][-1].beams) == 2
    assert run(s, "y", PROMPT + [4], "y")[0] == 0, "salt y read a salted beam search's KV"
    assert run(s, "x", PROMPT + [4], "x")[0] >= len(PROMPT) - 1
    assert_all_pages_back(s)


def test_unloading_an_adapter_evicts_its_salted_entries_too():
    s = make(loras=("a",), max_loras_per_batch=1)
    run(s, "as", PROMPT, "x", lora_path="a")
    run(s, "a", PROMPT, lora_path="a")
    run(s, "base", PROMPT, "x")
    held = s.tree.total_pages()
    s.admin.unload_lora("a")
    assert s.tree.total_pages() == held // 3, "the adapter's namespaces were not all evicted"
    assert run(s, "base2", PROMPT, "x")[0] == len(PROMPT) - 1  # the base model's salt x: kept
    assert_all_pages_back(s)


def test_fresh_salts_never_make_another_tenants_kv_unmatchable():
    """#56.6: salts had ids from a table of 4,096 (least recently used out): 4,097 requests with
    fresh salts made every other tenant's cached prefix a miss. Salt ids are keyed hashes now."""
    s = make()
    run(s, "victim", PROMPT, "victim-salt")
    for i in range(4097):
        s.namespaces.key_offset(None, f"fresh-{i}")  # what admitting each request does
    assert run(s, "victim-again", PROMPT, "victim-salt")[0] == len(PROMPT) - 1
    assert run(s, "other", PROMPT, "another-salt")[0] == 0  # and still nobody else's
    assert_all_pages_back(s)


def test_the_cache_view_shows_no_salted_tokens():
    s = make()
    run(s, "plain", PROMPT)
    run(s, "salted", PROMPT[::-1], "secret")
    nodes = s.admin.cache_tree(max_depth=1)["root"]["children"]
    plain = [n for n in nodes if not n["salted"]]
    salted = [n for n in nodes if n["salted"]]
    assert len(plain) == 1 and len(salted) == 1
    assert plain[0]["preview_ids"] == PROMPT[: len(plain[0]["preview_ids"])] != []
    assert salted[0]["preview_ids"] == [] and salted[0]["num_tokens"] > 0
    assert_all_pages_back(s)


@pytest.mark.parametrize("salt", ["", "x" * (MAX_CACHE_SALT_CHARS + 1), 7, ["a"]])
def test_a_bad_salt_is_refused_naming_it(salt):
    s = make()
    (out,) = ask(s, "bad", PROMPT, salt)
    assert out.error_status == 400 and "cache_salt" in out.error
    with pytest.raises(RequestError) as e:
        check_cache_salt(salt)  # the edge's rule, which intake ran above
    assert e.value.param == "cache_salt"
    assert not s.has_work()
    assert run(s, "ok", PROMPT, "x" * MAX_CACHE_SALT_CHARS)[0] == 0


def test_max_queued_requests_refuses_past_running_plus_queued_with_503():
    s = make(max_running_requests=2, max_queued_requests=1)
    prompts = {f"q{i}": [i] + PROMPT for i in range(1, 7)}  # distinct: none waits for another
    for rid in ("q1", "q2", "q3"):  # a burst: taken in before any step admits one
        assert ask(s, rid, prompts[rid]) == []
    (out,) = ask(s, "q4", prompts["q4"])
    assert out.error_status == 503 and "max-queued-requests" in out.error
    s.step()
    assert len(s.running) == 2 and len(s.waiting) == 1
    (out,) = ask(s, "q5", prompts["q5"])  # still 3 held: refused
    assert out.error_status == 503
    outs = drain(s)
    assert set(outs) == {"q1", "q2", "q3"}  # the refused ones were answered at once
    for rid in ("q1", "q2", "q3"):
        assert ids(outs, rid) == reference_output(prompts[rid], 4, VOCAB, None)
    assert ask(s, "q6", prompts["q6"]) == []  # room again once they ended
    drain(s)
    assert_all_pages_back(s)
