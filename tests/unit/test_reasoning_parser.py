"""Reasoning parsers (serving/openai_api/reasoning_parser.py) and the grammar held back until the thinking ends
(constrained/reasoning_gate.py).

Truths: an oracle written here with str.split for what each format means (SGLang's semantics: the
thinking stripped, the answer's leading whitespace dropped); every split of the text into stream
deltas must give the oracle's two strings. For the gate: the scheduler's decoding loop over a fake
model (test_budget_steering's `decode`) with the real tokenizer and outlines grammars, the answer
judged by `jsonschema` / `re.fullmatch` on the text after the end tag.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from test_budget_steering import decode
from test_grammar import compiled, validator

from radixrt.runtime.constrained.backend import GrammarBackend
from radixrt.runtime.constrained.reasoning_gate import ThinkingGate
from radixrt.runtime.serving.openai_api.reasoning_parser import (
    FORMATS,
    ReasoningParser,
    reasoning_token_count,
    separate,
    thinks,
)

TEXTS = [
    "<think>\nLet me see: 2 + 2.\n</think>\n\nThe answer is 4.",
    "Let me see.</think>The answer.",
    "  <think>a</think>  b  ",
    "<think>never closed, still thinking  ",
    "no tags at all",
    "<think></think>",
    "</think>only an answer",
    "<thi",
    "<think>x</thin",
    "a < b and </ thinking > not a tag </think>done",
    "<think>two</think>ends</think>here",
    "",
    "   ",
    "<think>é 日本 😀</think>ü",
]


def oracle(fmt, text: str) -> tuple[str, str]:
    head = text.lstrip()
    if head.startswith("<think>"):
        text, thinking = head[len("<think>") :], True
    else:
        thinking = fmt.starts_inside
    if not thinking:
        return "", text.lstrip()
    if "</think>" in text:
        reasoning, answer = text.split("</think>", 1)
        return reasoning.strip(), answer.lstrip()
    return text.strip(), ""


def streamed(fmt, pieces: list[str]) -> tuple[str, str]:
    parser = ReasoningParser(fmt)
    r, c = [], []
    for piece in pieces:
        a, b = parser.feed(piece)
        r.append(a)
        c.append(b)
    a, b = parser.finish()
    return "".join(r) + a, "".join(c) + b


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_split_gives_the_oracles_strings(name):
    fmt = FORMATS[name]
    for text in TEXTS:
        want = oracle(fmt, text)
        assert separate(fmt, text) == want, (name, text)
        assert streamed(fmt, list(text)) == want, (name, text, "char by char")
        for i, j in itertools.combinations(range(len(text) + 1), 2):
            assert streamed(fmt, [text[:i], text[i:j], text[j:]]) == want, (name, text, i, j)


def test_deltas_never_take_text_back():
    """What a stream sent stays a prefix of the final strings (no fragment is revised)."""
    fmt = FORMATS["deepseek-r1"]
    text = TEXTS[0]
    parser, sent_r, sent_c = ReasoningParser(fmt), "", ""
    for ch in text:
        a, b = parser.feed(ch)
        sent_r, sent_c = sent_r + a, sent_c + b
        want = oracle(fmt, text)
        assert want[0].startswith(sent_r) and want[1].startswith(sent_c)


def test_qwen3_thinks_unless_turned_off_and_the_thinking_formats_always():
    assert thinks(FORMATS["qwen3"], None) and thinks(FORMATS["qwen3"], {"enable_thinking": True})
    assert not thinks(FORMATS["qwen3"], {"enable_thinking": False})
    assert thinks(FORMATS["deepseek-r1"], {"enable_thinking": False})
    assert thinks(FORMATS["qwen3-thinking"], None)


def test_reasoning_token_count():
    assert reasoning_token_count([5, 6, 7, 9, 8], [7, 9], still_thinking=False) == 4
    assert reasoning_token_count([5, 6, 7], [7, 9], still_thinking=True) == 3
    assert reasoning_token_count([5, 6, 7], [7, 9], still_thinking=False) == 0


# ---------------------------------------------------------------- the grammar after the thinking
END = "</think>"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def backend(tokenizer):
    be = GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id], compile_timeout=120.0)
    yield be
    be.shutdown()


def answer_after(tokenizer, out: list[int], end_ids: list[int]) -> str:
    for i in range(len(out) - len(end_ids) + 1):
        if out[i : i + len(end_ids)] == end_ids:
            rest = [t for t in out[i + len(end_ids) :] if t != tokenizer.eos_token_id]
            return tokenizer.decode(rest)
    raise AssertionError("the thinking never ended")


@pytest.mark.parametrize("budget", [12, 20, 40, 90])
def test_the_answer_after_forced_thinking_validates(backend, tokenizer, budget):
    """A fake model that never closes its thinking by itself: the gate forces the end tag in time
    for the shortest valid answer, whose JSON then validates; no EOS while thinking."""
    end_ids = tokenizer.encode(END, add_special_tokens=False)
    spec = json.dumps(SCHEMA)
    inner = compiled(backend, "json_schema", spec)
    shortest = inner.shortest_completion()
    assert shortest is not None and shortest > 3
    gate = ThinkingGate(inner, end_ids)
    prefix = tokenizer.encode("Think first:")
    out = decode(gate, prefix, len(tokenizer), tokenizer.eos_token_id, budget)
    if budget < len(end_ids) + shortest:
        return  # nothing fits: nothing to check but that it ran
    text = answer_after(tokenizer, out, end_ids)
    assert gate.is_final(), (budget, text)
    assert not list(validator(SCHEMA).iter_errors(json.loads(text))), text
    thinking = out[: out.index(end_ids[0])]
    assert tokenizer.eos_token_id not in thinking


def test_thinking_that_ends_by_itself_is_left_alone(backend, tokenizer):
    """A model that writes its own end tag: the thinking is exactly its tokens, then the grammar."""
    end_ids = tokenizer.encode(END, add_special_tokens=False)
    own = tokenizer.encode(" two and two", add_special_tokens=False) + end_ids
    gate = ThinkingGate(compiled(backend, "regex", "[0-9]{1,3}"), end_ids)
    for t in own:
        gate.for_budget(100)
        gate.accept(t)
    assert not gate.thinking and gate.draft(5) == gate.inner.draft(5)
    out = decode(gate, own, len(tokenizer), tokenizer.eos_token_id, 20)
    text = tokenizer.decode([t for t in out if t != tokenizer.eos_token_id])
    assert re.fullmatch("[0-9]{1,3}", text), text


def test_gate_refuses_eos_while_thinking_and_forks(backend, tokenizer):
    end_ids = tokenizer.encode(END, add_special_tokens=False)
    gate = ThinkingGate(compiled(backend, "regex", "yes|no"), end_ids)
    with pytest.raises(ValueError):
        gate.accept(tokenizer.eos_token_id)
    some = tokenizer.encode("hmm", add_special_tokens=False)
    for t in some + end_ids:
        gate.accept(t)
    answer = tokenizer.encode("yes", add_special_tokens=False)
    for t in answer:
        gate.accept(t)
    twin = gate.fork(some + end_ids + answer)
    assert twin.is_final() and gate.is_final() and not twin.thinking
    assert ThinkingGate(compiled(backend, "regex", "yes|no"), end_ids).fork([]).thinking
