"""LoRA in the scheduler (core/lora_slots.py): adapter slots handed out least recently used first,
a request whose adapter finds no slot waits (never fails), the radix tree keyed by adapter, and an
unloaded adapter's entries evicted. Truth: the fake runner checks every step's slots (one adapter
per slot) and every request's KV; outputs equal `reference_output`; integrity after every step."""

from __future__ import annotations

import pytest
from fake_runner import FakeRunner, reference_output
from test_scheduler import VOCAB, assert_all_pages_back, drain, ids

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.lora_slots import LoraSlots
from radixrt.runtime.core.namespaces import KEY_STRIDE, TreeNamespaces, adapter_part
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sampling_params import SamplingParams


def running(*slots):
    out = []
    for s in slots:
        r = Req("r", [1], SamplingParams())
        r.lora_slot = s
        out.append(r)
    return out


def test_slots_are_reused_least_recently_used_first_and_never_taken_from_a_running_request():
    slots = LoraSlots(2)
    assert slots.take("a", []) == 0 and slots.take("b", []) == 1
    assert slots.take("a", running(0)) == 0  # its own slot, even while held
    assert slots.take("c", running(0, 1)) is None  # both held: wait
    assert slots.take("c", running(0)) == 1  # b's slot: not held
    slots.take("a", [])
    assert slots.take("b", []) == 1  # c's slot was used less recently than a's
    slots.retire("a")
    assert "a" not in slots.names


def test_each_adapter_and_salt_pair_is_a_namespace_and_ids_are_never_reused():
    spaces = TreeNamespaces()
    pairs = [(None, None), ("a", None), ("b", None), ("a", "s"), (None, "s"), ("b", "t")]
    offsets = [spaces.key_offset(*p) for p in pairs]
    assert offsets[0] == 0 and len(set(offsets)) == len(pairs)  # each pair its own
    assert all(o % KEY_STRIDE == 0 for o in offsets)
    assert [spaces.key_offset(*p) for p in pairs] == offsets  # known: the same
    a_part = adapter_part(offsets[1] // KEY_STRIDE)
    assert adapter_part(offsets[3] // KEY_STRIDE) == a_part  # a's salted namespace: a's part
    assert spaces.retire("a") == {a_part} and spaces.retire("a") == set()
    again = spaces.key_offset("a", None)
    assert again not in offsets  # a reloaded adapter: a new namespace
    assert spaces.is_plain(0) and spaces.is_plain(again // KEY_STRIDE)
    assert spaces.is_plain(offsets[2] // KEY_STRIDE)  # b, unsalted
    assert not spaces.is_plain(offsets[4] // KEY_STRIDE)  # salted
    assert not spaces.is_plain(offsets[1] // KEY_STRIDE), (
        "a retired namespace is not known any more"
    )
    # a salt's id is a keyed hash: another process (another key) gives another id
    assert TreeNamespaces().key_offset(None, "s") != offsets[4]


def make(loras=("a", "b", "c"), max_loras=2, num_tokens=2000):
    cfg = ServerConfig(page_size=1, chunked_prefill_size=64, max_loras_per_batch=max_loras)
    return Scheduler(cfg, FakeRunner(num_tokens, vocab_size=VOCAB, loras=loras, max_rows=17))


def submit(s, rid, prompt, lora, max_new=8):
    s.add_request(
        TokenizedGenerateReq(
            rid=rid,
            input_ids=prompt,
            sampling_params={"max_new_tokens": max_new},
            options=RequestOptions(lora=lora),
        )
    )
    return s.take_outputs()


def test_more_adapters_than_slots_wait_their_turn_and_finish_right():
    s = make()
    prompts = {}
    for i, lora in enumerate(["a", "b", "c", None, "c", "a"]):
        prompts[str(i)] = [1 + i, 2, 3, 4, 5]
        submit(s, str(i), prompts[str(i)], lora, max_new=10 + i)
    outs = drain(s)
    for rid, p in prompts.items():
        assert ids(outs, rid) == reference_output(p, 10 + int(rid), VOCAB, 0)
    assert max(len(set(step.values())) for step in s.runner.lora_steps) == 2
    assert_all_pages_back(s)


def test_the_same_prompt_under_two_adapters_shares_nothing_but_reuses_its_own():
    s = make()
    prompt = list(range(1, 30))
    for rid, lora in (("a1", "a"), ("b1", "b"), ("n1", None), ("a2", "a")):
        submit(s, rid, prompt, lora)
        (out,) = [o for o in drain(s)[rid] if o.finished_reason]
        expected = 28 if rid == "a2" else 0
        assert out.cached_tokens == expected, (rid, out.cached_tokens)
    s.check_integrity()


def test_unknown_adapters_are_refused_and_unloading_evicts_their_entries():
    s = make(loras=("a",))
    (out,) = submit(s, "x", [1, 2, 3], "zz")
    assert out.error_status == 400 and "'zz' is not loaded" in out.error
    submit(s, "y", list(range(1, 40)), "a")
    s.step()
    with pytest.raises(ValueError, match="in flight"):
        s.admin.unload_lora("a")
    drain(s)
    in_tree = s.tree.total_pages()
    s.admin.unload_lora("a")
    assert s.tree.total_pages() < in_tree and s.tree.total_pages() == 0
    (out,) = submit(s, "z", [1, 2, 3], "a")
    assert "'a' is not loaded" in out.error
    assert_all_pages_back(s)
