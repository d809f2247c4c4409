"""Reasoning models through a real server (`--reasoning-parser`): the default model forced through the
`deepseek-r1` parser (its output starts inside the thinking), and a tiny random Qwen3 (the default
model's vocabulary with `<think>` / `</think>` added as single tokens, a Qwen3-style template with
`enable_thinking`) under `qwen3`.

Truths: the answer after the thinking is judged by `jsonschema`; what the server separated is compared
with an oracle's split (str.split) of the raw text the same request gives with
`separate_reasoning: false`; streamed deltas must reassemble to the whole answer; reasoning_tokens is
counted independently from the output ids.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from conftest_server import ServerProcess
from model_cases import save_random_model

pytestmark = pytest.mark.integration
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"}},
    "required": ["city", "rank"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
ASK = [{"role": "user", "content": "Which city is the largest in France? Think, then answer."}]


def oracle(text: str, starts_inside: bool) -> tuple[str, str]:
    head = text.lstrip()
    if head.startswith("<think>"):
        text, inside = head[len("<think>") :], True
    else:
        inside = starts_inside
    if not inside:
        return "", text.lstrip()
    if "</think>" in text:
        reasoning, answer = text.split("</think>", 1)
        return reasoning.strip(), answer.lstrip()
    return text.strip(), ""


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    srv = ServerProcess(
        [
            "--reasoning-parser",
            "deepseek-r1",
            "--max-total-tokens",
            "2048",
            "--log-level",
            "warning",
        ],
        tmp_path_factory.mktemp("r1"),
    )
    yield srv
    srv.stop()


def _extra(body: dict) -> dict:
    """SGLang's fields travel in the client's extra_body."""
    extra = {k: body.pop(k) for k in ("separate_reasoning", "stream_reasoning") if k in body}
    return {**body, "extra_body": {**body.get("extra_body", {}), **extra}}


def chat(url: str, **body):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300).chat.completions.create(
        model="default", temperature=0, **_extra(body)
    )


def stream(url: str, **body) -> tuple[str, str, dict]:
    """(reasoning, content, usage) reassembled from the chunks."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
    reasoning, content, usage = [], [], None
    for chunk in client.chat.completions.create(
        model="default",
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **_extra(body),
    ):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning.append(extra.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    return "".join(reasoning), "".join(content), usage


def test_the_answer_after_the_thinking_follows_the_schema(r1):
    reply = chat(r1.url, messages=ASK, max_tokens=48, response_format=JSON_FORMAT)
    msg = reply.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    reasoning = msg.model_extra["reasoning_content"]
    assert isinstance(reasoning, str) and reasoning.strip()
    assert "</think>" not in msg.content and "</think>" not in reasoning
    details = reply.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.completion_tokens
    # the raw text of the same (greedy) request: the oracle splits it as the server did
    raw = chat(
        r1.url, messages=ASK, max_tokens=48, response_format=JSON_FORMAT, separate_reasoning=False
    )
    assert raw.choices[0].message.model_extra.get("reasoning_content") is None
    assert oracle(raw.choices[0].message.content, starts_inside=True) == (reasoning, msg.content)
    # streamed: the deltas reassemble to the whole answer, and the usage counts the thinking
    s_reasoning, s_content, usage = stream(
        r1.url, messages=ASK, max_tokens=48, response_format=JSON_FORMAT
    )
    assert (s_reasoning, s_content) == (reasoning, msg.content)
    assert usage["completion_tokens_details"]["reasoning_tokens"] == details.reasoning_tokens


def test_unconstrained_output_is_split_as_the_oracle_splits_it(r1):
    raw = chat(r1.url, messages=ASK, max_tokens=24, separate_reasoning=False)
    text = raw.choices[0].message.content
    reply = chat(r1.url, messages=ASK, max_tokens=24)
    reasoning, content = oracle(text, starts_inside=True)
    assert reply.choices[0].message.content == content
    assert reply.choices[0].message.model_extra["reasoning_content"] == (reasoning or None)
    s_reasoning, s_content, _ = stream(r1.url, messages=ASK, max_tokens=24, stream_reasoning=False)
    assert (s_reasoning, s_content) == (reasoning, content)


def test_separate_reasoning_route(r1):
    r = httpx.post(r1.url + "/separate_reasoning", json={"text": "<think> a </think> b"})
    assert r.status_code == 200 and r.json() == {"text": "b", "reasoning_text": "a"}
    r = httpx.post(
        r1.url + "/separate_reasoning", json={"text": "plain", "reasoning_parser": "qwen3"}
    )
    assert r.json() == {"text": "plain", "reasoning_text": ""}
    r = httpx.post(r1.url + "/separate_reasoning", json={"text": "x", "reasoning_parser": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_parser"
    r = httpx.post(r1.url + "/separate_reasoning", json={"text": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"


# ---------------------------------------------------------------- a tiny Qwen3 with think tokens
QWEN3_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, model_dir):
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = QWEN3_TEMPLATE
    config = tf.Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("qwen3") / "model"
    save_random_model(config, tok, path)
    srv = ServerProcess(
        ["--model-path", str(path), "--reasoning-parser", "qwen3", "--log-level", "warning"],
        tmp_path_factory.mktemp("qwen3-server"),
    )
    yield srv, tok
    srv.stop()


def test_qwen3_thinks_then_answers_in_the_schema(qwen3):
    srv, _ = qwen3
    reply = chat(srv.url, messages=ASK, max_tokens=40, response_format=JSON_FORMAT)
    msg = reply.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert msg.model_extra["reasoning_content"] is not None
    # </think> is one token here: the thinking is the output tokens up to and including it,
    # counted from the raw request's per-token logprobs
    raw = chat(
        srv.url,
        messages=ASK,
        max_tokens=40,
        response_format=JSON_FORMAT,
        separate_reasoning=False,
        logprobs=True,
    )
    tokens = [entry.token for entry in raw.choices[0].logprobs.content]
    assert reply.usage.completion_tokens_details.reasoning_tokens == tokens.index("</think>") + 1
    thinking, answer = raw.choices[0].message.content.split("</think>", 1)
    assert thinking.strip() == (msg.model_extra["reasoning_content"] or "")
    assert answer.strip() == msg.content


def test_qwen3_without_thinking_answers_directly(qwen3):
    srv, _ = qwen3
    reply = chat(
        srv.url,
        messages=ASK,
        max_tokens=40,
        response_format=JSON_FORMAT,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    msg = reply.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert msg.model_extra.get("reasoning_content") is None
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def test_a_required_call_comes_after_the_thinking(r1):
    """Tools under a reasoning parser: the thinking is reasoning_content, the call after it is
    grammar-valid, whole and streamed alike."""
    body = dict(
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        max_tokens=48,
        tools=[ADD],
        tool_choice="required",
    )
    reply = chat(r1.url, **body)
    msg = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for call in msg.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), ADD["function"]["parameters"])
    assert (
        msg.model_extra["reasoning_content"]
        and "</think>" not in msg.model_extra["reasoning_content"]
    )
    assert reply.usage.completion_tokens_details.reasoning_tokens > 0
    client = openai.OpenAI(base_url=r1.url + "/v1", api_key="none", timeout=300)
    reasoning, args = [], {}
    for chunk in client.chat.completions.create(
        model="default", temperature=0, stream=True, **body
    ):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            for call in choice.delta.tool_calls or []:
                args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
    assert "".join(reasoning) == msg.model_extra["reasoning_content"]
    assert [args[i] for i in sorted(args)] == [c.function.arguments for c in msg.tool_calls]


def test_responses_give_the_thinking_as_a_reasoning_item(r1):
    client = openai.OpenAI(base_url=r1.url + "/v1", api_key="none", timeout=300)
    resp = client.responses.create(
        model="default",
        input="Which city is the largest in France?",
        max_output_tokens=48,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}},
    )
    kinds = [item.type for item in resp.output]
    assert kinds[0] == "reasoning" and "message" in kinds, kinds
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    assert resp.usage.output_tokens_details.reasoning_tokens > 0


SEARCH = {
    "type": "function",
    "function": {
        "name": "search_notes",
        "description": "Search the user's notes.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def test_a_required_call_fits_a_small_budget_after_thinking_that_never_ends(qwen3):
    """#56 (seen through the Agents SDK under --reasoning-parser qwen3: finish_reason length, no
    call, no text): the random model never closes its thinking, so the end tag is forced while a
    whole call still fits 64 tokens; sampled, every reply is one valid call."""
    srv, _ = qwen3
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300)
    for seed in range(4):
        reply = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Find my notes about the meeting with Anna."}],
            tools=[SEARCH],
            tool_choice="required",
            max_tokens=64,
            temperature=1.0,
            seed=seed,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, reply
        (call,) = choice.message.tool_calls[:1]
        assert call.function.name == "search_notes"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SEARCH["function"]["parameters"])
        assert reply.usage.completion_tokens <= 64
