"""Beam search on the default model against transformers' beam search (the truth), in float32.

`Engine.beam_search` must return the sequences `generate(num_beams=k, do_sample=False, ...)`
returns, with their length-penalised scores (allclose), for widths 2 and 4 over prompts of
different lengths (a chat prompt whose beams end on EOS inside the budget included), other length
penalties and early_stopping values; beams and ordinary requests in one batch both stay right;
constrained beams all follow their grammar (checked by `re` / a JSON parser); beams share pages
(peak well under width x one sequence); a preempted search ends the same; every page comes back.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from radixrt.runtime.engine.engine import Engine

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning he",
]
CHAT = [{"role": "user", "content": "What is 2+2? Reply with only the number."}]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(dtype="float32", max_total_tokens=6000, page_size=4)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def prompts(engine):
    chat = engine.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return PROMPTS + [chat]


def hf_beams(hf_model, tokenizer, prompt, width, max_new, eos, **kw):
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    pad = 1 if 1 not in eos else 3  # not 0: transformers fills with EOS when pad is falsy
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),  # a prompt token may be pad
            num_beams=width,
            num_return_sequences=width,
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=pad,
            return_dict_in_generate=True,
            output_scores=True,
            **kw,
        )
    rows = out.sequences[:, len(ids) :].tolist()
    return [(row, float(score)) for row, score in zip(rows, out.sequences_scores)], pad


def assert_same_beams(ours, theirs, pad):
    assert len(ours) == len(theirs)
    for beam, (row, score) in zip(ours, theirs):
        n = len(beam["output_ids"])
        assert beam["output_ids"] == row[:n] and all(t == pad for t in row[n:]), (beam, row)
        assert beam["meta_info"]["beam_score"] == pytest.approx(score, rel=2e-4, abs=1e-4)


@pytest.mark.parametrize("width", [2, 4])
def test_beams_equal_transformers(engine, prompts, hf_model, width):
    eos = sorted(engine.scheduler.eos_ids)
    results = engine.beam_search(prompts, beam_width=width, max_new_tokens=14)
    ended_early = 0
    for prompt, ours in zip(prompts, results):
        theirs, pad = hf_beams(hf_model, engine.tokenizer, prompt, width, 14, eos)
        assert_same_beams(ours, theirs, pad)
        for beam in ours:
            meta = beam["meta_info"]
            n = len(beam["output_ids"])
            assert meta["beam_score"] == pytest.approx(meta["cumulative_logprob"] / n, rel=1e-5)
            assert beam["text"] == engine.tokenizer.decode(
                beam["output_ids"], skip_special_tokens=True
            )
            ended_early += n < 14 and beam["output_ids"][-1] in eos
    assert ended_early >= width, "the chat prompt's beams end on EOS inside the budget"
    engine.check_integrity()


@pytest.mark.parametrize(
    "options",
    [
        {"length_penalty": 2.0, "early_stopping": False},
        {"length_penalty": 0.5, "early_stopping": True},
        {"length_penalty": -1.0, "early_stopping": "never"},
    ],
    ids=str,
)
def test_length_penalty_and_early_stopping_equal_transformers(engine, prompts, hf_model, options):
    eos = sorted(engine.scheduler.eos_ids)
    for prompt in (prompts[0], prompts[-1]):
        ours = engine.beam_search(prompt, beam_width=3, max_new_tokens=10, **options)
        theirs, pad = hf_beams(hf_model, engine.tokenizer, prompt, 3, 10, eos, **options)
        assert_same_beams(ours, theirs, pad)
    engine.check_integrity()


def test_beam_and_ordinary_requests_in_one_batch(engine, prompts):
    alone_beams = engine.beam_search(prompts[:2], beam_width=3, max_new_tokens=10, num_return=2)
    greedy = {"temperature": 0, "max_new_tokens": 10}
    alone_greedy = engine.generate(prompts, greedy)
    beam = {"beam_width": 3, "n": 2, "max_new_tokens": 10}
    mixed = engine.generate(prompts + prompts[:2], [greedy] * len(prompts) + [beam, beam])
    assert [m["output_ids"] for m in mixed[: len(prompts)]] == [
        g["output_ids"] for g in alone_greedy
    ]
    for got, want in zip(mixed[len(prompts) :], alone_beams):
        assert [b["output_ids"] for b in got] == [b["output_ids"] for b in want]
    one = engine.generate(prompts[0], {**beam, "n": 1})  # n = 1: the best beam, as one result
    assert one["output_ids"] == alone_beams[0][0]["output_ids"]
    engine.check_integrity()


def test_constrained_beams_all_follow_the_grammar(engine):
    pattern = r"(sunny|rainy|cloudy) and (warm|cold|windy)\."
    beams = engine.beam_search(
        "The weather today is", beam_width=4, max_new_tokens=12, sampling_params={"regex": pattern}
    )
    assert len(beams) >= 2
    assert all(re.fullmatch(pattern, b["text"]) for b in beams), [b["text"] for b in beams]
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    beams = engine.beam_search(
        "A person as JSON:",
        beam_width=3,
        max_new_tokens=30,
        sampling_params={"json_schema": json.dumps(schema)},
    )
    for b in beams:
        value = json.loads(b["text"])
        assert set(value) == {"name", "age"} and isinstance(value["age"], int), b["text"]
    engine.check_integrity()


def test_beams_share_their_pages(engine, prompts):
    width, max_new = 4, 24
    (beams,) = engine.beam_search(
        [prompts[2]], beam_width=width, max_new_tokens=max_new, sampling_params={"ignore_eos": True}
    )
    prompt_len = beams[0]["meta_info"]["prompt_tokens"]
    one_sequence = -(-(prompt_len + max_new) // 4)
    peak = beams[0]["meta_info"]["beam_peak_pages"]
    assert peak < 0.5 * width * one_sequence, (peak, one_sequence)
    engine.check_integrity()


def test_a_preempted_beam_search_ends_the_same(engine, prompts):
    want = engine.beam_search(prompts[0], beam_width=4, max_new_tokens=20)
    long_prompt = " ".join(["apple", "pear", "plum", "fig"] * 25)
    other = {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True}
    # each fits alone (the beams even unshared), both together not: the newer one, the beam
    # search, is preempted and runs again once the long request is done
    small = Engine(dtype="float32", max_total_tokens=160, page_size=4, chunked_prefill_size=256)
    try:
        beam = {"beam_width": 4, "max_new_tokens": 20}
        outs = small.generate([long_prompt, prompts[0]], [other, beam])
        assert small.scheduler.stats.num_preemptions > 0
        assert [b["output_ids"] for b in outs[1]] == [b["output_ids"] for b in want]
        assert outs[0]["output_ids"] == engine.generate(long_prompt, other)["output_ids"]
        small.check_integrity()
        assert small.flush_cache()
        assert (
            small.scheduler.memory.allocator.num_free == small.scheduler.memory.allocator.num_pages
        )
    finally:
        small.shutdown()


def test_refused_beam_requests_name_the_problem(engine):
    with pytest.raises(ValueError, match="stream"):
        next(iter(engine.generate("Hi", {"beam_width": 2}, stream=True)))
    with pytest.raises(ValueError, match="beam_width"):
        engine.beam_search("Hi", beam_width=8, max_new_tokens=1000)  # 8 x 1000 > the pool
    with pytest.raises(ValueError, match="repetition_penalty"):
        engine.beam_search("Hi", sampling_params={"repetition_penalty": 1.2})
    with pytest.raises(ValueError, match="return_logprob"):
        engine.generate("Hi", {"beam_width": 2}, return_logprob=True)
    engine.check_integrity()
