"""A really launched `radixrt serve` on the default model (small KV pool, an API key), driven by the real
`openai` client and by raw HTTP: chat / completions / /generate, streamed == non-streamed, greedy
HTTP == in-process Engine, >= 15 bad requests, 48 concurrent streams with a quarter dropped, 401s,
metrics, and a SIGTERM that leaves no process and no socket file behind (last test).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import httpx
import openai
import pytest
import torch
from conftest_server import ServerProcess, sse_events

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
POOL_TOKENS = 2048
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(
        [
            "--max-total-tokens",
            str(POOL_TOKENS),
            "--api-key",
            KEY,
            "--log-level",
            "warning",
            "--max-request-body-bytes",
            "1000000",
        ],
        tmp_path_factory.mktemp("real"),
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=300)


def post(server, path: str, body, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=300, **kw)


def server_info(server) -> dict:
    return httpx.get(server.url + "/get_server_info", headers=AUTH, timeout=60).json()


def test_models_and_model_info(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct"]
    info = httpx.get(server.url + "/get_model_info", headers=AUTH, timeout=30).json()
    assert (
        info["context_length"] == 8192
        and info["vocab_size"] == 49152
        and 2 in info["eos_token_ids"]
    )


def test_chat_stream_equals_nonstream_and_uses_chat_template(server, client, tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three colors."},
    ]
    full = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24, temperature=0
    )
    text = full.choices[0].message.content
    assert text and full.choices[0].finish_reason in ("stop", "length")
    expected_prompt = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert full.usage.prompt_tokens == len(
        tokenizer.encode(expected_prompt, add_special_tokens=False)
    )
    assert full.usage.completion_tokens <= 24
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    short = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=messages, temperature=0, max_completion_tokens=3
    )
    assert short.usage.completion_tokens == 3 and text.startswith(short.choices[0].message.content)


def test_completions_stop_logprobs_and_n(server, client):
    base = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=16, temperature=0
    )
    text = base.choices[0].text
    assert base.usage.completion_tokens == 16 and base.choices[0].finish_reason == "length"
    # a word from the middle: stop there (OpenAI: the stop string is not shown)
    word = text.split()[1]
    stopped = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        stop=[word],
        logprobs=3,
    )
    c = stopped.choices[0]
    assert c.text == text[: text.index(word)] and c.finish_reason == "stop"
    lp = c.logprobs
    assert (
        len(lp.tokens)
        == stopped.usage.completion_tokens
        == len(lp.token_logprobs)
        == len(lp.top_logprobs)
    )
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) <= 3
        assert abs(chosen - max(top.values())) < 1e-4  # greedy picks the most likely token
    many = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=[PROMPT, "2 + 2 ="],
        max_tokens=6,
        temperature=0.9,
        seed=7,
        n=2,
    )
    assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
    again = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=[PROMPT, "2 + 2 ="],
        max_tokens=6,
        temperature=0.9,
        seed=7,
        n=2,
    )
    # seeds seed+i reproduce
    assert [ch.text for ch in many.choices] == [ch.text for ch in again.choices]
    # choice 2k+j is prompt k sampled with seed 7+j: the same as asking for that one alone
    for k, prompt in enumerate([PROMPT, "2 + 2 ="]):
        for j in range(2):
            alone = client.completions.create(
                model="SmolLM2-135M-Instruct",
                prompt=prompt,
                max_tokens=6,
                temperature=0.9,
                seed=7 + j,
            )
            assert many.choices[2 * k + j].text == alone.choices[0].text, (k, j)
    assert any(many.choices[2 * k].text != many.choices[2 * k + 1].text for k in range(2)), (
        "the n samples of a prompt are all the same: seeds are not seed+i"
    )


def test_generate_single_batch_stream_logprobs(server):
    sp = {"max_new_tokens": 12, "temperature": 0}
    one = post(server, "/generate", {"text": PROMPT, "sampling_params": sp}).json()
    meta = one["meta_info"]
    assert meta["completion_tokens"] == len(one["output_ids"]) == 12 and meta["prompt_tokens"] == 5
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    batch = post(
        server, "/generate", {"text": [PROMPT, "Once upon a time"], "sampling_params": sp}
    ).json()
    assert batch[0]["text"] == one["text"] and batch[0]["output_ids"] == one["output_ids"]
    # the same prompt again: served from the radix cache
    assert batch[0]["meta_info"]["cached_tokens"] >= 4
    with httpx.stream(
        "POST",
        server.url + "/generate",
        headers=AUTH,
        timeout=300,
        json={"text": PROMPT, "sampling_params": sp, "stream": True},
    ) as r:
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]" and json.loads(events[-2])["text"] == one["text"]
    lp = post(
        server,
        "/generate",
        {
            "text": PROMPT,
            "sampling_params": sp,
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
        },
    ).json()["meta_info"]
    assert [t for _, t, _ in lp["output_token_logprobs"]] == one["output_ids"]
    assert len(lp["input_token_logprobs"]) == 5 and lp["input_token_logprobs"][0][0] is None
    assert all(len(top) == 2 and top[0][0] >= top[1][0] for top in lp["output_top_logprobs"])


def test_greedy_http_equals_engine(server):
    from radixrt import Engine

    prompts = ["Write one sentence about the sea.", "List the first five prime numbers:"]
    sp = {"max_new_tokens": 20, "temperature": 0, "stop": ["\n\n"]}
    http = [post(server, "/generate", {"text": p, "sampling_params": sp}).json() for p in prompts]
    engine = Engine(dtype="float32", max_total_tokens=POOL_TOKENS)
    try:
        local = engine.generate(prompts, sp)
    finally:
        engine.shutdown()
    for h, e in zip(http, local):
        assert h["output_ids"] == e["output_ids"] and h["text"] == e["text"]
        assert h["meta_info"]["finish_reason"] == e["meta_info"]["finish_reason"]


def test_constrained_decoding_through_http(server, client):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=100,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    g = post(
        server,
        "/generate",
        {
            "text": "My four-digit PIN is",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "regex": "[0-9]{4}"},
        },
    ).json()
    assert re.fullmatch("[0-9]{4}", g["text"]), g


def bad_requests(server) -> list[tuple[str, str, object]]:
    user = [{"role": "user", "content": "hi"}]
    chat = {"model": "SmolLM2-135M-Instruct", "messages": user, "max_tokens": 4}
    return [
        ("POST", "/v1/chat/completions", b"{not json"),
        ("POST", "/v1/chat/completions", b'{"model": "SmolLM2-135M-Instruct"}'),  # no messages
        ("POST", "/v1/chat/completions", {**chat, "messages": "hi"}),
        (
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "wizard", "content": "hi"}]},
        ),
        (
            "POST",
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        ),
        ("POST", "/v1/chat/completions", {**chat, "temperature": -1}),
        ("POST", "/v1/chat/completions", {**chat, "temperature": "hot"}),
        ("POST", "/v1/chat/completions", {**chat, "top_p": 0}),
        ("POST", "/v1/chat/completions", {**chat, "n": 1000}),
        ("POST", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 50}),
        ("POST", "/v1/chat/completions", {**chat, "max_tokens": -5}),
        (
            "POST",
            "/v1/chat/completions",
            {**chat, "max_tokens": 100000},
        ),  # more than the whole KV pool
        ("POST", "/v1/chat/completions", {**chat, "model": "gpt-9"}),
        ("POST", "/v1/chat/completions", {**chat, "presence_penalty": 5}),
        ("POST", "/v1/chat/completions", {**chat, "seed": -1}),
        ("POST", "/v1/chat/completions", {**chat, "stop": 7}),
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "x", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        ),
        (
            "POST",
            "/v1/chat/completions",
            b'{"messages": ' + b'[{"role": "user", "content": "' + b"a" * 1_100_000 + b'"}]}',
        ),
        ("POST", "/v1/chat/completions", {**chat, "response_format": {"type": "xml"}}),
        (
            "POST",
            "/v1/chat/completions",
            {
                **chat,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "frob"}},
                },
            },
        ),
        ("POST", "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": ""}),
        (
            "POST",
            "/v1/completions",
            {"model": "SmolLM2-135M-Instruct", "prompt": "x", "logprobs": 50},
        ),
        ("POST", "/generate", {"text": "x", "input_ids": [1, 2]}),
        ("POST", "/generate", {"input_ids": [1, 2, 10**9]}),
        (
            "POST",
            "/generate",
            {"input_ids": list(range(100, 9100))},
        ),  # longer than the 8192 context
        ("POST", "/generate", {"text": "x", "sampling_params": {"temprature": 0.5}}),
        ("POST", "/generate", [1, 2, 3]),
        ("GET", "/no/such/route", None),
    ]


def test_beam_search_over_generate_and_openai(server, client, hf_model):
    """/generate with beam_width and the OpenAI routes with use_beam_search return transformers'
    beams (float32 server), best first; streaming a beam search is a 400 naming stream."""
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    res = post(
        server,
        "/generate",
        {"input_ids": ids, "sampling_params": {"beam_width": 3, "max_new_tokens": 8}},
    )
    assert res.status_code == 200, res.text
    beams = res.json()
    with torch.no_grad():
        hf = hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            num_beams=3,
            num_return_sequences=3,
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=2,
            pad_token_id=1,
            return_dict_in_generate=True,
            output_scores=True,
        )
    assert [b["index"] for b in beams] == [0, 1, 2]
    for beam, row, score in zip(beams, hf.sequences[:, len(ids) :].tolist(), hf.sequences_scores):
        assert beam["output_ids"] == row[: len(beam["output_ids"])]
        assert beam["meta_info"]["beam_score"] == pytest.approx(float(score), rel=2e-4, abs=1e-4)
    completion = client.completions.create(
        model="default",
        prompt=ids,
        max_tokens=8,
        n=2,
        extra_body={"use_beam_search": True, "best_of": 3},
    )
    assert [c.text for c in completion.choices] == [b["text"] for b in beams[:2]]
    assert completion.usage.completion_tokens == sum(len(b["output_ids"]) for b in beams[:2])
    chat = post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "n": 2, "use_beam_search": True},
    )
    assert chat.status_code == 200 and len(chat.json()["choices"]) == 2, chat.text
    for body, path in (
        ({"input_ids": ids, "stream": True, "sampling_params": {"beam_width": 2}}, "/generate"),
        (
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "n": 2,
                "use_beam_search": True,
                "stream": True,
            },
            "/v1/chat/completions",
        ),
    ):
        refused = post(server, path, body)
        assert refused.status_code == 400 and "stream" in refused.text, refused.text
    narrow = post(server, "/v1/completions", {"prompt": "Hi", "use_beam_search": True})
    assert narrow.status_code == 400 and "best_of" in narrow.text


def test_unknown_openai_fields_are_ignored_and_named(server):
    chat = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    for stream in (False, True):
        r = post(
            server,
            "/v1/chat/completions",
            {**chat, "frobnicate": True, "metadata": {"a": 1}, "stream": stream},
        )
        assert (
            r.status_code == 200 and r.headers["x-radixrt-ignored-fields"] == "frobnicate,metadata"
        ), r.text
    r = post(
        server,
        "/v1/completions",
        {
            "model": "SmolLM2-135M-Instruct",
            "prompt": "x",
            "max_tokens": 1,
            "reasoning_effort": "low",
        },
    )
    assert r.status_code == 200 and r.headers["x-radixrt-ignored-fields"] == "reasoning_effort"
    assert "x-radixrt-ignored-fields" not in post(server, "/v1/chat/completions", chat).headers


def test_bad_requests_are_4xx_and_server_keeps_serving(server):
    cases = bad_requests(server)
    assert len(cases) >= 15
    for method, path, body in cases:
        kw = (
            {"content": body}
            if isinstance(body, bytes)
            else ({"json": body} if body is not None else {})
        )
        r = httpx.request(
            method,
            server.url + path,
            headers={**AUTH, "Content-Type": "application/json"},
            timeout=60,
            **kw,
        )
        assert 400 <= r.status_code < 500, (path, str(body)[:200], r.status_code, r.text[:300])
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    ok = post(server, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2


def test_api_key_required_except_health(server):
    for path in ("/v1/models", "/get_server_info", "/metrics", "/get_model_info"):
        assert httpx.get(server.url + path, timeout=30).status_code == 401
        assert (
            httpx.get(
                server.url + path, headers={"Authorization": "Bearer nope"}, timeout=30
            ).status_code
            == 401
        )
    r = httpx.post(server.url + "/generate", json={"text": "x"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    # no --admin-api-key: the cache view (other tenants' prompts) is refused whatever the key
    refused = httpx.get(server.url + "/cache_tree", headers=AUTH, timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_not_set"
    # the dashboard's page and scripts carry no data: served without the key (the page asks for it)
    for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/plotly.min.js"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path


def test_48_concurrent_streams_quarter_dropped(server):
    before = server_info(server)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, dict | None]:
        body = {
            "model": "SmolLM2-135M-Instruct",
            "prompt": f"Question {i}: what is {i} plus {i}? Answer:",
            "max_tokens": 24,
            "temperature": 0.8,
            "seed": i,
            "ignore_eos": True,
            "stream": True,
        }
        drop = i % 4 == 0
        text, last = "", None
        async with client.stream(
            "POST", server.url + "/v1/completions", json=body, headers=AUTH
        ) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                last = json.loads(line[6:])
                text += last["choices"][0]["text"]
                seen += 1
                if drop and seen == 2:
                    return i, None  # leaving the block closes the connection mid-stream
        return i, {"text": text, "finish_reason": last["choices"][0]["finish_reason"]}

    async def run():
        async with httpx.AsyncClient(
            timeout=600, limits=httpx.Limits(max_connections=64)
        ) as client:
            return await asyncio.gather(*[one(client, i) for i in range(48)])

    results = asyncio.run(run())
    kept = [r for i, r in results if i % 4 != 0]
    assert len(kept) == 36 and all(r["finish_reason"] == "length" and r["text"] for r in kept)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = server_info(server)
        if (
            info["num_running"] == 0
            and info["num_waiting"] == 0
            and info["num_inflight_requests"] == 0
        ):
            break
        time.sleep(0.2)
    # the dropped ones were aborted
    assert info["num_requests_aborted"] - before["num_requests_aborted"] >= 9
    flushed = httpx.post(server.url + "/flush_cache", headers=AUTH, timeout=60)
    assert flushed.status_code == 200
    info = server_info(server)
    assert info["kv_pages_free"] == info["kv_pages_total"]


def test_metrics(server, client):
    """Self-contained: the counters move by exactly what this test sends (no reliance on earlier tests)."""

    def scrape() -> str:
        return httpx.get(server.url + "/metrics", headers=AUTH, timeout=60).text

    def count(text: str, name: str) -> float:
        return sum(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")
        )

    before = scrape()
    for i in range(3):
        body = {
            "text": f"Count to {i + 3}:",
            "sampling_params": {"max_new_tokens": 4},
            "stream": True,
        }
        with httpx.stream(
            "POST", server.url + "/generate", json=body, headers=AUTH, timeout=120
        ) as r:
            assert r.status_code == 200 and sse_events(list(r.iter_lines()))[-1] == "[DONE]"
    client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2)
    after = scrape()
    for name in (
        "radixrt:time_to_first_token_seconds_count",
        "radixrt:inter_token_latency_seconds_count",
        "radixrt:prompt_tokens_total",
        "radixrt:generation_tokens_total",
        "radixrt:cache_hit_rate",
        "radixrt:kv_pages_total",
        "radixrt:token_usage",
        "radixrt:num_preemptions",
        'radixrt:http_requests_total{route="/v1/completions",status="200"}',
    ):
        assert name in after, name
    ttft = "radixrt:time_to_first_token_seconds_count"
    # every streamed request got its first token once
    assert count(after, ttft) - count(before, ttft) == 3
    generated = "radixrt:generation_tokens_total"
    assert count(after, generated) - count(before, generated) == 3 * 4 + 2


def test_zz_sigterm_stops_everything(server):
    assert len(server.child_pids) >= 2 and server.ipc_leftovers()
    code = server.stop(signal.SIGTERM, timeout=60)
    assert code == 0, server.log()
    time.sleep(0.5)
    assert server.alive_pids() == []
    assert server.ipc_leftovers() == []
