"""Agents on the HTTP API, driven by the real `openai` client against real servers.

Truth: every tool call's arguments validate against the tool's JSON schema (`jsonschema`), streamed calls
reassemble to what the non-streamed request returned, a session's next turn is a cache hit for the turn
before it even after filler traffic has evicted everything unpinned (the scheduler's cached_tokens), and
/tokenize agrees with the tokenizer itself.

Two servers with the same flags. `server` runs the session's tiny random Llama with the default
tokenizer (tests/conftest.py), for the tests whose truth is the grammar, the edge or our own
bookkeeping, which hold for any weights. `real_server` runs the real default model, for the three
that need it: an `auto` request answered in text or by the right call (what the model knows), and a
session's turns, which are cache hits only when the previous reply's text encodes back to the tokens
it was sampled as (natural text does; a random model's token salad often does not).
"""

import json

import httpx
import jsonschema
import openai
import pytest
from conftest_server import ServerProcess

pytestmark = pytest.mark.integration
POOL_TOKENS = 2048
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 999},
                "b": {"type": "integer", "minimum": 0, "maximum": 999},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = [{"role": "user", "content": "What's the weather in Paris?"}]


def few_shot() -> list[dict]:
    """A history in which the assistant answered weather questions by calling the tool (so `auto` calls)."""
    msgs = []
    for city, temp in [("Paris", 22), ("Berlin", 18), ("Madrid", 30)]:
        args = json.dumps({"city": city, "unit": "celsius"})
        msgs += [
            {"role": "user", "content": f"What's the weather in {city}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{city}",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": args},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{city}",
                "content": json.dumps({"temperature": temp}),
            },
            {"role": "assistant", "content": f"It is {temp} degrees in {city}."},
        ]
    return msgs + [{"role": "user", "content": "What's the weather in Rome?"}]


ADMIN_KEY = "agent-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


SERVER_ARGS = [
    *("--max-total-tokens", str(POOL_TOKENS), "--log-level", "warning"),
    *("--admin-api-key", ADMIN_KEY),  # the session table and the cache view are the admin's
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        ["--model-path", tiny_model_dir, *SERVER_ARGS], tmp_path_factory.mktemp("agent")
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    srv = ServerProcess(SERVER_ARGS, tmp_path_factory.mktemp("agent-real"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)


@pytest.fixture(scope="module")
def real_client(real_server):
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key="none", timeout=300)


def check_calls(calls, names=None) -> list[tuple[str, dict]]:
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        assert names is None or call.function.name in names
        out.append((call.function.name, args))
    return out


def streamed(client, **kw) -> tuple[str, list[tuple[str, str, str]], str]:
    """(content, [(id, name, arguments)], finish_reason) reassembled from the stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            entry = calls.setdefault(tc.index, ["", "", ""])
            entry[0] = tc.id or entry[0]
            entry[1] += (tc.function.name or "") if tc.function else ""
            entry[2] += (tc.function.arguments or "") if tc.function else ""
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "add"}}]
)
def test_required_and_named_calls_always_validate(client, tool_choice):
    named = None if tool_choice == "required" else {"add"}
    for question in ["What's the weather in Paris?", "What is 12 plus 30?", "Hello there!"]:
        kw = dict(
            model="default",
            messages=[{"role": "user", "content": question}],
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=80,
            temperature=0,
        )
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
        whole = check_calls(choice.message.tool_calls, named)
        content, calls, finish = streamed(client, **kw)
        assert finish == "tool_calls" and not content
        assert [(name, json.loads(args)) for _, name, args in calls] == whole
        assert all(cid.startswith("call_") for cid, _, _ in calls)


def test_sampled_calls_validate_and_parallel_false_gives_one(client):
    called = 0
    for seed in range(4):
        r = client.chat.completions.create(
            model="default",
            messages=QUESTION,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=120,
            temperature=1.0,
            seed=seed,
            parallel_tool_calls=False,
            n=2,
        )
        for choice in r.choices:
            if choice.finish_reason == "tool_calls":
                assert len(check_calls(choice.message.tool_calls)) == 1
                called += 1
            else:  # only running out of tokens can stop a call early
                assert choice.finish_reason == "length"
    # most of the 8 samples finish their call: the checks above are not vacuous
    assert called >= 4, called


def test_auto_answers_in_text_or_opens_a_constrained_call(real_client):
    """The real model: the plain question answered in text, the few-shot one by a call to
    get_weather for Rome (what the model makes of the prompt, not the grammar)."""
    client = real_client
    plain = client.chat.completions.create(
        model="default", messages=QUESTION, tools=TOOLS, max_tokens=24, temperature=0
    )
    assert plain.choices[0].message.content and not plain.choices[0].message.tool_calls
    kw = dict(
        model="default",
        messages=few_shot(),
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=60,
        temperature=0,
    )
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    whole = check_calls(r.choices[0].message.tool_calls)
    assert whole == [("get_weather", {"city": "Rome", "unit": "celsius"})]
    content, calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and [(n, json.loads(a)) for _, n, a in calls] == whole
    assert r.usage.prompt_tokens_details.cached_tokens > 0


def test_two_step_agent_loop(real_client):
    """The real model: under `auto` it chooses to call the tool (a random model answers in text)."""
    client = real_client
    msgs = few_shot()
    r = client.chat.completions.create(
        model="default", messages=msgs, tools=TOOLS, max_tokens=60, temperature=0
    )
    call = r.choices[0].message.tool_calls[0]
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 25})},
    ]
    answer = client.chat.completions.create(
        model="default",
        messages=msgs,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=20,
        temperature=0,
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "n": 2}, "n"),
        ({"tools": TOOLS, "logprobs": True}, "logprobs"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tools",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"x": {"type": "frob"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            None,
        ),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(server, body, param):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": QUESTION, "max_tokens": 4, **body},
        timeout=120,
    )
    assert r.status_code == 400, r.text
    assert param is None or r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def filler(server, i: int) -> None:
    """Unrelated traffic big enough to evict everything unpinned from the 2,048-token pool."""
    r = httpx.post(
        server.url + "/generate",
        json={
            "text": f"Filler document {i}: " + "lorem ipsum dolor sit amet " * 90,
            "sampling_params": {"max_new_tokens": 1},
        },
        timeout=300,
    )
    assert r.status_code == 200


def test_session_turns_stay_cached_under_pressure(real_server, real_client):
    """The real model: a turn's cache hit covers the previous reply only as far as the reply's text,
    sent back as the assistant message, encodes to the tokens it was sampled as."""
    server, client = real_server, real_client
    info = lambda: httpx.get(  # noqa: E731
        server.url + "/get_server_info", headers=ADMIN, timeout=60
    ).json()
    msgs = [{"role": "user", "content": "Hi! Tell me about the sea."}]
    prev = None
    for turn in range(4):
        r = client.chat.completions.create(
            model="default",
            messages=msgs,
            max_tokens=12,
            temperature=0,
            extra_body={"session_id": "chat-1"},
        )
        cached = r.usage.prompt_tokens_details.cached_tokens
        if prev is not None:
            # everything the previous turn computed KV for: its prompt and its output but the last token
            # (sampled, never fed back); the template's turn markers after the reply are new
            assert cached >= prev - 1, (turn, cached, prev)
        prev = r.usage.prompt_tokens + r.usage.completion_tokens
        for i in range(3):
            filler(server, 10 * turn + i)
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"And what about question {turn}?"},
        ]
    session = info()["sessions"]["chat-1"]
    # others see neither the ids nor the counts (an admin key is set: status_routes.CLIENT_INFO)
    public = httpx.get(server.url + "/get_server_info", timeout=60).json()
    assert not {"sessions", "num_sessions"} & public.keys() and "chat-1" not in str(public)
    assert session["turns"] == 4 and session["cached_tokens"] > 0 and 0 < session["hit_rate"] < 1
    assert info()["num_pins"] == 1
    tree = httpx.get(server.url + "/cache_tree", headers=ADMIN, timeout=60).json()
    stack, owned = [tree["root"]], []
    while stack:
        node = stack.pop()
        stack += node["children"]
        owned += [node["prefix_len"]] if node["sessions"] == ["chat-1"] else []
    # the cache view names the session holding the last turn
    assert owned and max(owned) >= prev - 1
    assert httpx.post(
        server.url + "/close_session", json={"session_id": "chat-1"}, timeout=60
    ).json()["success"]
    after = info()
    assert after["num_pins"] == 0 and after["num_sessions"] == 0 and after["integrity_ok"]
    # once closed, the same traffic evicts the conversation: the next turn without a session is mostly a miss
    for i in range(3):
        filler(server, 100 + i)
    r = client.chat.completions.create(model="default", messages=msgs, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens < prev // 2
    assert (
        httpx.post(server.url + "/close_session", json={"sid": "x"}, timeout=60).status_code == 400
    )
    bad = httpx.post(
        server.url + "/generate", json={"text": "x", "session_id": "s" * 200}, timeout=60
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
    # SGLang's shape of the same field
    turn = {
        "text": "Hi there",
        "session_params": {"id": "sg-1"},
        "sampling_params": {"max_new_tokens": 2},
    }
    assert httpx.post(server.url + "/generate", json=turn, timeout=60).status_code == 200
    assert info()["sessions"]["sg-1"]["turns"] == 1
    assert httpx.post(
        server.url + "/close_session", json={"session_id": "sg-1"}, timeout=60
    ).json()["success"]


def test_openai_details(server, client, tokenizer):
    base = dict(model="default", max_tokens=3, temperature=0)
    as_system = client.chat.completions.create(
        messages=[{"role": "system", "content": "Be brief."}, *QUESTION], **base
    )
    as_developer = client.chat.completions.create(
        messages=[{"role": "developer", "content": "Be brief."}, *QUESTION], **base
    )
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    named = client.chat.completions.create(
        messages=[{"role": "user", "name": "ann", "content": "Hi"}], **base
    )
    assert named.choices[0].message.content is not None
    for reserved in ({"chat_template": "{{ 1 }}"}, {"tokenize": True}, {"return_dict": True}):
        with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
            client.chat.completions.create(
                messages=QUESTION, extra_body={"chat_template_kwargs": reserved}, **base
            )
    odd = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": QUESTION, "max_tokens": 1, "参数": 1, "ok_field": 2},
        timeout=60,
    )
    assert odd.status_code == 200 and odd.headers["x-radixrt-ignored-fields"] == "ok_field"
    kwargs = client.chat.completions.create(
        messages=QUESTION, extra_body={"chat_template_kwargs": {"unused": 1}}, **base
    )
    assert (
        kwargs.choices[0].message.content
        == client.chat.completions.create(messages=QUESTION, **base).choices[0].message.content
    )
    # logit_bias: +100 on one token makes it every greedy pick; an id past the vocabulary is a 400
    token = tokenizer.encode(" banana", add_special_tokens=False)[0]
    biased = client.completions.create(
        model="default",
        prompt="The capital of France is",
        max_tokens=3,
        temperature=0,
        logit_bias={str(token): 100},
    )
    assert biased.choices[0].text == tokenizer.decode([token] * 3)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(
            model="default", prompt="x", max_tokens=1, logit_bias={"99999999": 1}
        )
    # usage in every chunk with continuous_usage_stats, and the cached tokens of a repeated prompt
    chunks = list(
        client.chat.completions.create(
            messages=QUESTION,
            stream=True,
            **base,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    assert all(c.usage is not None for c in chunks[1:]) and chunks[-1].usage.completion_tokens == 3
    again = client.chat.completions.create(messages=QUESTION, **base)
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - 1
    # SGLang's names
    assert client.models.list().data[0].owned_by == "sglang"
    for path in ("/server_info", "/model_info", "/get_server_info", "/get_model_info"):
        assert httpx.get(server.url + path, timeout=60).status_code == 200, path


def test_tokenize_round_trips(server, tokenizer):
    for text in ["Hello world", "  spaces and ünïcödé ✓", "<|im_start|>user\nhi<|im_end|>", ""]:
        for special in (True, False):
            r = httpx.post(
                server.url + "/tokenize",
                json={"text": text, "add_special_tokens": special},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["tokens"] == tokenizer.encode(text, add_special_tokens=special)
            assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
            back = httpx.post(
                server.url + "/detokenize", json={"tokens": body["tokens"]}, timeout=60
            ).json()
            assert back["text"] == tokenizer.decode(body["tokens"]) == back["prompt"]
    batch = httpx.post(server.url + "/tokenize", json={"prompt": ["a b", "c"]}, timeout=60).json()
    assert batch["tokens"] == [tokenizer.encode("a b"), tokenizer.encode("c")]
    for path, body, param in (
        ("/tokenize", {}, "text"),
        ("/tokenize", {"text": 5}, "text"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "x"}, "tokens"),
    ):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)


def test_a_required_call_cut_short_leaves_no_content(client):
    """max_tokens ends a grammar-constrained call inside its opening tag: no partial tag as content."""
    for stream in (False, True):
        reply = client.chat.completions.create(
            model="default", messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=3,
            stream=stream,
        )  # fmt: skip
        if stream:
            chunks = list(reply)
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            content, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
        assert finish == "length" and content == "", (stream, content)
