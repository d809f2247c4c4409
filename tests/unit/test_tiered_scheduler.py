"""The scheduler over two cache tiers (--enable-hierarchical-cache) on the fake runner.

Truth: `reference_output` from token ids alone; the fake runner asserts every prefix slot it reads holds the
request's own token, so KV loaded back from the tier into the wrong page, or stale, fails at once. Outputs
must equal the reference with the tier on, under eviction, preemption, aborts and corrupt tier pages; the
tier must actually serve (tokens loaded, fewer tokens computed than with it off); check_integrity after
every step, and a flush returns every page of both tiers.
"""

import random

import pytest
from fake_runner import FakeRunner, reference_output
from test_scheduler import VOCAB, drain, ids, run_preempting_batch, submit

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler


def make(tier: bool, page_size=1, num_tokens=240, policy="write_back", ratio=8.0):
    cfg = ServerConfig(
        page_size=page_size,
        chunked_prefill_size=64,
        max_running_requests=8,
        enable_hierarchical_cache=tier,
        hicache_ratio=ratio,
        hicache_write_policy=policy,
    )
    return Scheduler(
        cfg,
        FakeRunner(
            num_pages=num_tokens // page_size,
            page_size=page_size,
            vocab_size=VOCAB,
            eos=None,
            max_rows=9,
        ),
    )


def conversations(s, rng, num_conv=6, turns=4, user_tokens=30, out_tokens=12, history=None):
    """Multi-turn chats, one turn of every conversation at a time: each history grows past the pool's share.
    Returns the histories (pass them back to go on with the same chats)."""
    history = history or {c: [rng.randrange(1, VOCAB) for _ in range(20)] for c in range(num_conv)}
    for turn in range(turns):
        for c in range(num_conv):
            history[c] += [rng.randrange(1, VOCAB) for _ in range(user_tokens)]
            submit(s, f"{c}-{turn}", history[c], max_new_tokens=out_tokens)
        outs = drain(s)
        for c in range(num_conv):
            got = ids(outs, f"{c}-{turn}")
            assert got == reference_output(history[c], out_tokens, VOCAB, None), (c, turn)
            history[c] += got
    return history


def assert_both_tiers_empty_after_flush(s):
    assert s.admin.flush_cache()
    s.check_integrity()
    assert s.memory.allocator.num_free == s.memory.allocator.num_pages
    assert s.tree.host.num_free == s.tree.host.num_pages


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["write_back", "write_through", "write_through_selective"])
def test_multi_turn_history_comes_back_from_the_tier(page_size, policy):
    computed = {}
    for tier in (False, True):
        s = make(tier, page_size, policy=policy)
        conversations(s, random.Random(page_size))
        computed[tier] = s.stats.prompt_tokens - s.stats.cached_tokens
        if tier:
            info = s.admin.server_info()
            assert (
                info["hicache_enabled"]
                and info["hicache_tokens_loaded"] > 0
                and info["hicache_hits"] > 0
            )
            assert_both_tiers_empty_after_flush(s)
    assert computed[True] < computed[False] * 0.6, computed


def test_preempted_requests_swap_out_and_back():
    s = make(True, page_size=2, num_tokens=160)
    run_preempting_batch(s, random.Random(5), prompt_len=24, new_tokens=50)
    assert s.tree.tier_stats.tokens_loaded > 0, "a preempted request's KV came back from the tier"
    assert_both_tiers_empty_after_flush(s)


def test_aborts_and_corrupt_pages_never_change_outputs():
    rng = random.Random(9)
    s = make(True, page_size=2)
    history = conversations(s, rng, turns=2)
    for node in s.tree._nodes():  # every page in the tier now "fails its checksum"
        if node.host_value is not None:
            s.runner.kv_tier.corrupt.update(node.host_value)
    conversations(
        s, rng, turns=2, history=history
    )  # the same chats go on: recomputed where the tier was corrupt
    assert s.tree.tier_stats.checksum_failures > 0
    prompts = {str(i): [rng.randrange(1, VOCAB) for _ in range(40)] for i in range(6)}
    for rid, p in prompts.items():
        submit(s, rid, p, max_new_tokens=30)
    for _ in range(6):
        s.step()
        s.take_outputs()  # this step's outputs are not looked at
    s.abort("1")
    s.abort("4")
    outs = drain(s)
    for rid in ("0", "2", "3", "5"):
        assert ids(outs, rid) == reference_output(prompts[rid], 30, VOCAB, None), rid
    assert_both_tiers_empty_after_flush(s)


def test_corrupt_tier_in_a_conversation_is_recomputed():
    rng = random.Random(11)
    s = make(True, page_size=1)
    history = [rng.randrange(1, VOCAB) for _ in range(200)]
    submit(s, "a", history, max_new_tokens=4)
    history += ids(drain(s), "a")
    submit(
        s, "b", [rng.randrange(1, VOCAB) for _ in range(200)], max_new_tokens=4
    )  # pushes "a" to the tier
    drain(s)
    for node in s.tree._nodes():
        if node.host_value is not None:
            s.runner.kv_tier.corrupt.update(node.host_value[len(node.host_value) // 2 :])
    history += [7, 8, 9]
    submit(s, "c", history, max_new_tokens=8)
    assert ids(drain(s), "c") == reference_output(history, 8, VOCAB, None)
    assert s.tree.tier_stats.checksum_failures > 0


def test_tier_figures_reach_server_info_and_metrics():
    from radixrt.runtime.serving.http.metrics import HICACHE_GAUGES, ServerMetrics

    s = make(True, page_size=1)
    conversations(s, random.Random(2), turns=2)
    info = s.admin.server_info()
    assert (
        info["hicache_tokens_loaded"] == s.runner.kv_tier.pages_read * s.config.page_size > 0
    )  # what the tier copied
    assert info["hicache_pages_used"] == len(s.tree.host_page_ids()) > 0
    assert (
        info["hicache_load_latency_p50_s"] is not None
        and info["hicache_write_policy"] == "write_back"
    )
    metrics = ServerMetrics()
    metrics.update_from_server_info(info)
    text = metrics.render().decode()
    for key in HICACHE_GAUGES:
        assert f"radixrt:{key} {float(info[key] or 0)}" in text, key
