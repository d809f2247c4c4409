"""DSL programs on the real default model through the in-process Engine: every
primitive, greedy output equal to transformers', and fork's prefix computed once."""

from __future__ import annotations

import json

import jsonschema
import pytest
from dsl_shared import Recorder, engine_backend, hf_greedy

import radixrt as sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "rank"],
    "additionalProperties": False,
}


@sgl.function
def every_primitive(s, topic):
    s += sgl.system("You are a terse assistant.")
    with s.user():
        s += "Name one fact about " + topic + "."
    s += sgl.assistant(sgl.gen("fact", max_tokens=12, stop="."))
    s += sgl.user("Pick a number from 1 to 9.")
    s += sgl.assistant(sgl.gen_int("number", max_tokens=4))
    s += sgl.user("Give a code like AB-12.")
    s += sgl.assistant(sgl.gen("code", max_tokens=8, regex=r"[A-Z]{2}-[0-9]{2}"))
    s += sgl.user("Answer in JSON with a city and a rank.")
    s += sgl.assistant(sgl.gen("record", max_tokens=40, json_schema=SCHEMA))
    s += sgl.user("Is " + topic + " alive?")
    s += sgl.assistant(sgl.select("alive", choices=["yes", "no"]))
    forks = s.fork(2)
    forks += lambda i: sgl.user(f"Give a {'short' if i == 0 else 'long'} name for it.")
    forks += sgl.assistant(sgl.gen("name", max_tokens=6))
    forks.join()
    with s.var_scope("closing"):
        s += sgl.user("Thanks!") + sgl.assistant(sgl.gen("bye", max_tokens=6))


def check_every_primitive(state) -> None:
    assert state["fact"] and "." not in state["fact"]
    int(state["number"])
    assert len(state["code"]) == 5 and state["code"][2] == "-"
    jsonschema.validate(json.loads(state["record"]), SCHEMA)
    assert state["alive"] in ("yes", "no")
    assert isinstance(state["name"], list) and len(state["name"]) == 2
    assert state["closing"].endswith(state["bye"] + "<|im_end|>\n")
    roles = [m["role"] for m in state.messages()]
    assert roles[:3] == ["system", "user", "assistant"] and roles.count("user") == 6


def test_every_primitive_on_the_engine_is_deterministic_at_temperature_zero():
    be = engine_backend()
    first = every_primitive.run(topic="a cat", backend=be, temperature=0)
    check_every_primitive(first)
    second = every_primitive.run(topic="a cat", backend=be, temperature=0)
    assert second.text() == first.text() and second["name"] == first["name"]


def test_gen_equals_transformers_greedy_token_for_token():
    be = engine_backend()

    @sgl.function
    def ask(s):
        s += sgl.user("Write one sentence about the sea.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=24))

    state = ask.run(backend=be, temperature=0)
    prompt = state.text()[: len(state.text()) - len(state["answer"] + "<|im_end|>\n")]
    ids = be.tokenize(prompt)
    truth = hf_greedy(ids, 24)
    text = be.engine.tokenizer.decode(truth, skip_special_tokens=True)
    assert state["answer"] == text


def test_fork_computes_the_shared_prefix_once():
    be = engine_backend()
    be.flush_cache()
    prefix = ("Here is a long shared context that every branch reads. " * 6).strip() + "\n"
    num_prefix = len(be.tokenize(prefix))

    @sgl.function
    def branches(s):
        s += prefix
        forks = s.fork(4)
        forks += lambda i: f"Branch {i}:"
        forks += sgl.gen("out", max_tokens=4)
        forks.join()

    before = be.get_server_info()
    state = branches.run(backend=be, temperature=0)
    after = be.get_server_info()
    outs = state["out"]
    assert len(outs) == 4
    # each branch's request found the whole prefix in the cache ...
    program_metas = [exe.meta_info["out"] for exe in state.stream_executor.program.executors[1:]]
    assert all(m["cached_tokens"] >= num_prefix for m in program_metas), program_metas
    # ... and across the whole program the prefix's tokens were computed exactly once
    computed = (after["prompt_tokens"] - before["prompt_tokens"]) - (
        after["cached_tokens"] - before["cached_tokens"]
    )
    branch_new = sum(m["prompt_tokens"] - m["cached_tokens"] for m in program_metas)
    assert computed == num_prefix + branch_new, (computed, num_prefix, branch_new)


def test_streaming_on_the_engine_matches_the_blocking_run():
    be = engine_backend()

    @sgl.function
    def ask(s):
        s += sgl.user("Count from one to five in words.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    blocking = ask.run(backend=be, temperature=0)
    streamed = ask.run(backend=be, temperature=0, stream=True)
    pieces = list(streamed.text_iter("answer"))
    assert "".join(pieces) == blocking["answer"] and len(pieces) > 1


def test_run_batch_on_the_engine_precaches_the_common_prefix():
    be = engine_backend()
    be.flush_cache()
    instructions = "Classify the sentiment of each review as positive or negative. Be careful. " * 3

    @sgl.function
    def classify(s, review):
        s += instructions + "\nReview: " + review + "\nSentiment: "
        s += sgl.select("label", choices=["positive", "negative"])

    reviews = ["I loved it.", "Terrible, never again.", "Great value!", "It broke in a day."]
    with Recorder(be) as rec:
        states = classify.run_batch([{"review": r} for r in reviews], backend=be, temperature=0)
    assert all(st["label"] in ("positive", "negative") for st in states)
    num_instr = len(be.tokenize(instructions))
    # the traced prefix was computed (and pinned) before the batch: even the first request finds it cached
    assert rec.calls and all(
        m["cached_tokens"] >= num_instr for _, metas in rec.calls for m in metas
    )
    assert be.engine.get_server_info()["num_pins"] == 0, "the batch's pin is released when it ends"


def test_a_failing_gen_on_the_engine_names_the_program_line():
    be = engine_backend()

    @sgl.function
    def bad(s):
        s += "x" + sgl.gen("y", max_tokens=4, temperature=-1.0)  # BAD_TEMPERATURE

    with pytest.raises(sgl.ProgramError, match="BAD_TEMPERATURE") as info:
        bad.run(backend=be)
    assert "temperature" in str(info.value)


def test_gen_n_samples_equal_single_seeded_gens_and_share_the_prompt():
    """gen(n=k): the variable is a list of k samples; sample i is exactly the same gen alone with seed + i
    (the runtime's n rule); the program's text goes on with the first sample; the prompt is computed
    once, the other samples read it from the cache."""
    be = engine_backend()
    prompt = (
        "A list of animals that live in the sea, one per line, with a short note on each. " * 3
    ) + "\n1."
    sampling = {"max_tokens": 8, "temperature": 1.0, "top_p": 0.95}

    @sgl.function
    def samples(s):
        s += prompt
        s += sgl.gen("animal", n=3, seed=21, **sampling)
        s += " (end)"

    before = be.get_server_info()
    state = samples.run(backend=be)
    after = be.get_server_info()
    animals = state["animal"]
    assert isinstance(animals, list) and len(animals) == 3 and len(set(animals)) > 1, animals
    assert state.text() == prompt + animals[0] + " (end)"
    metas = state.get_meta_info("animal")
    assert len(metas) == 3 and all(m["completion_tokens"] >= 1 for m in metas)
    num_prompt = len(be.tokenize(prompt))
    computed = (after["prompt_tokens"] - before["prompt_tokens"]) - (
        after["cached_tokens"] - before["cached_tokens"]
    )
    # the other two samples each recompute only the prompt's last token (its logits start their draw)
    assert computed <= num_prompt + 2, (computed, num_prompt)

    @sgl.function
    def single(s, seed):
        s += prompt
        s += sgl.gen("animal", n=1, seed=seed, **sampling)

    assert [single.run(backend=be, seed=21 + i)["animal"] for i in range(3)] == animals
    for bad in (0, True, 2.0, 65):
        with pytest.raises(ValueError, match="gen n must be"):
            sgl.gen("x", n=bad)
    be.engine.check_integrity()  # the engine is shared by this module's tests (dsl_shared): no shutdown


def test_a_multi_turn_program_keeps_its_turns_cached_in_a_session():
    """Runs of one program with session_id are turns of a conversation: each turn's KV stays pinned until the
    next, so unrelated traffic that fills the small pool does not evict it (cached_tokens is the truth)."""
    engine = sgl.Engine(dtype="float32", max_total_tokens=1024)
    backend = sgl.EngineBackend(engine)

    @sgl.function
    def turn(s, history, question):
        s += history
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0))

    try:
        history, kept = "", None
        for i, question in enumerate(
            ["Hi, who are you?", "Where do you live?", "What do you like?"]
        ):
            state = turn.run(history=history, question=question, backend=backend, session_id="dsl")
            meta = state.get_meta_info("answer")
            if kept is not None:
                assert meta["cached_tokens"] >= kept, (i, meta)
            # the last sampled token has no KV
            kept = meta["prompt_tokens"] + meta["completion_tokens"] - 1
            history = state.text()
            for k in range(3):  # unrelated traffic: 3 x ~300 tokens fill the 1,024-token pool
                engine.generate(
                    f"Unrelated filler {i}-{k}: " + "lorem ipsum " * 140, {"max_new_tokens": 1}
                )
        assert engine.get_server_info()["sessions"]["dsl"]["turns"] == 3
        backend.close_session("dsl")
        engine.check_integrity()
        assert engine.get_server_info()["num_pins"] == 0
    finally:
        engine.shutdown()
