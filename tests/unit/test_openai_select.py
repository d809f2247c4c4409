"""sgl.OpenAI's select: scored by echoed prompt logprobs where the server answers echo (vLLM),
the constrained generation where it refuses (a 400), and the token boundary counted from the end."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
import openai
import pytest

import radixrt as sgl
from radixrt.frontend.choices import (
    greedy_token_selection,
    unconditional_likelihood_normalized,
)
from radixrt.frontend.openai_backend import _tail_entries

# word-level "tokens" with their leading space, as a byte-level BPE cuts "Answer: B"
TOKEN = re.compile(r" ?[A-Za-z]+| ?[^A-Za-z ]| ")


class FakeCompletions:
    """An OpenAI-compatible /v1/completions: echo with prompt logprobs from a table, or a 400."""

    def __init__(self, logprobs: dict[str, float], refuse_echo: bool = False):
        self.logprobs, self.refuse_echo, self.calls = logprobs, refuse_echo, []

    def create(self, **kw):
        self.calls.append(kw)
        prompts = kw["prompt"] if isinstance(kw["prompt"], list) else [kw["prompt"]]
        if kw.get("echo"):
            if self.refuse_echo:
                request = httpx.Request("POST", "http://fake/v1/completions")
                raise openai.BadRequestError(
                    "echo together with logprobs is not supported",
                    response=httpx.Response(400, request=request),
                    body=None,
                )
            return SimpleNamespace(choices=[self._echo(i, p) for i, p in enumerate(prompts)])
        # a generation: the first listed choice of the regex, as a constrained server would
        text = kw["extra_body"]["regex"][3:].split("|")[0].rstrip(")")
        return SimpleNamespace(
            id="x",
            usage=None,
            choices=[SimpleNamespace(index=0, text=text, finish_reason="stop")],
        )

    def _echo(self, index: int, prompt: str):
        tokens = TOKEN.findall(prompt)
        assert "".join(tokens) == prompt
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        values = [None] + [self.logprobs.get(t, -9.0) for t in tokens[1:]]
        logprobs = SimpleNamespace(tokens=tokens, token_logprobs=values, text_offset=offsets)
        return SimpleNamespace(index=index, logprobs=logprobs, text=prompt)


def _backend(fake: FakeCompletions, chat: bool = False) -> sgl.OpenAI:
    be = sgl.OpenAI("m", base_url="http://127.0.0.1:9/v1", is_chat_model=chat)
    be.client = SimpleNamespace(completions=fake)
    return be


@sgl.function
def pick(s, choices, method=None):
    s += "Question: which? Answer: "
    kwargs = {"choices_method": method} if method is not None else {}
    s += sgl.select("answer", choices=choices, **kwargs)


def test_select_scores_the_choices_by_echoed_prompt_logprobs_in_one_request():
    fake = FakeCompletions({" A": -2.0, " B": -0.5, " Bee": -1.0, " hive": -3.0})
    state = pick.run(backend=_backend(fake), choices=["A", "B", "Bee hive"])
    assert state["answer"] == "B" and state.text().endswith("Answer: B")
    (call,) = fake.calls
    assert call["echo"] and call["max_tokens"] == 0 and call["logprobs"] == 0
    assert call["prompt"] == [f"Question: which? Answer: {c}" for c in ("A", "B", "Bee hive")]
    meta = state.get_meta_info("answer")
    assert meta["method"] == "prompt logprobs (echo)"
    # the prefix's trailing space merged into the choice's first token: that token is the choice's
    assert [[e[2] for e in row] for row in meta["input_token_logprobs"]] == [
        [" A"],
        [" B"],
        [" Bee", " hive"],
    ]
    assert meta["normalized_prompt_logprobs"] == [-2.0, -0.5, -2.0]


def test_other_choices_methods_get_the_same_entries():
    fake = FakeCompletions({" x": -1.0, " y": -1.0, " z": -0.1, "x": -3.0, "y": -0.2})
    state = pick.run(backend=_backend(fake), choices=["x", "y z"], method=greedy_token_selection)
    assert state["answer"] == "y z"  # tie on the first token, " z" decides
    # unconditional: each choice's own tokens echoed alone (a first token has no logprob)
    fake = FakeCompletions({" x": -1.0, " y": -1.0, " z": -2.0})
    state = pick.run(
        backend=_backend(fake), choices=["x", "y z"], method=unconditional_likelihood_normalized
    )
    assert fake.calls[1]["prompt"] == [" x", " y z"]
    # x: -1 - 0 = -1 ; y z: mean(-1 - 0, -2 - (-2)) = -0.5
    assert state["answer"] == "y z"


def test_a_server_refusing_echo_gets_the_constrained_generation_and_is_not_asked_again():
    fake = FakeCompletions({}, refuse_echo=True)
    be = _backend(fake)
    for _ in range(2):
        state = pick.run(backend=be, choices=["no", "yes"])
        assert state["answer"] == "no"
        assert "constrained greedy generation" in state.get_meta_info("answer")["method"]
    assert [bool(c.get("echo")) for c in fake.calls] == [True, False, False]


@pytest.mark.parametrize(
    ("tokens", "tail", "expected"),
    [
        (["Answer", ":", " B"], 1, [" B"]),  # " B" ends past the boundary: the choice's
        (["Answer", ":", " ", "B"], 1, ["B"]),
        (["a", "bc", "d"], 2, ["bc", "d"]),  # a token across the boundary belongs to the choice
        (["a", "b"], 0, ["b"]),  # an empty choice: at least the last token, as on the Engine
    ],
)
def test_tail_entries(tokens, tail, expected):
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    lp = SimpleNamespace(tokens=tokens, token_logprobs=[None] * len(tokens), text_offset=offsets)
    assert [e[2] for e in _tail_entries(lp, tail)] == expected
