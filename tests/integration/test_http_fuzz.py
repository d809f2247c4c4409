"""HTTP fuzz of a real `radixrt serve`: hypothesis-made bodies (random JSON, wrong types, huge numbers,
odd unicode, missing or unknown fields, raw bytes) to /generate, /v1/completions and
/v1/chat/completions. Whatever comes in, the answer is never a 5xx: a 4xx with an OpenAI-style error
body, or a 200 for a valid-but-odd request; the server stays healthy and leaks no KV page. The server
runs the session's tiny random Llama with the default tokenizer (tests/conftest.py): the edge's answers
do not depend on what the weights know, and valid bodies run in a fraction of the time.
"""

from __future__ import annotations

import json

import httpx
import pytest
from conftest_server import ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NUM_EXAMPLES = 150
counts: dict[str, dict[int, int]] = {}

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e308, -1e308, 1e-320, 2**63, -1])
    | st.text(max_size=40)
    | st.sampled_from(["", "\x00", "\ud800", "👩‍👩‍👧" * 5, "\u202e", "é" * 300, "<|im_end|>"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
# max_tokens: small, or anything at all
small_int = st.integers(min_value=-2, max_value=4) | json_values


def maybe(keys: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A dict with any subset of keys (so fields go missing), plus sometimes an unknown one."""
    return st.fixed_dictionaries({}, optional=keys).flatmap(
        lambda d: st.dictionaries(st.text(max_size=8), json_values, max_size=1).map(
            lambda extra: {**extra, **d}
        )
    )


sampling = maybe(
    {
        "max_new_tokens": small_int,
        "temperature": st.floats(-1, 3) | json_values,
        "top_p": json_values,
        "top_k": json_values,
        "stop": json_values,
        "n": st.integers(-1, 3) | json_values,
        "regex": json_values,
        "json_schema": json_values,
        "choices": json_values,
        "seed": json_values,
        "ignore_eos": json_values,
        "stop_token_ids": json_values,
        "repetition_penalty": json_values,
    }
)
generate_bodies = (
    maybe(
        {
            "text": st.text(max_size=30) | json_values,
            "input_ids": st.lists(st.integers(-5, 60000), max_size=8) | json_values,
            "sampling_params": sampling | json_values,
            "stream": json_values,
            "return_logprob": json_values,
            "logprob_start_len": json_values,
            "top_logprobs_num": json_values,
            "return_text_in_logprobs": json_values,
        }
    )
    | json_values
)

openai_common = {
    "model": st.text(max_size=10) | json_values,
    "max_tokens": small_int,
    "temperature": json_values,
    "top_p": json_values,
    "n": st.integers(-1, 3) | json_values,
    "stop": json_values,
    "stream": json_values,
    "stream_options": json_values,
    "logprobs": json_values,
    "seed": json_values,
    "response_format": json_values,
    "presence_penalty": json_values,
    "logit_bias": json_values,
    "user": json_values,
}
completion_bodies = (
    maybe(
        {
            **openai_common,
            "prompt": st.text(max_size=30) | json_values,
            "echo": json_values,
            "suffix": json_values,
        }
    )
    | json_values
)
message = maybe(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | json_values,
        "content": st.text(max_size=30) | json_values,
        "name": json_values,
    }
)
chat_bodies = (
    maybe(
        {
            **openai_common,
            "messages": st.lists(message, max_size=3) | json_values,
            "top_logprobs": json_values,
            "max_completion_tokens": small_int,
            "tools": json_values,
        }
    )
    | json_values
)
odd_text = st.text(max_size=40) | st.sampled_from(
    [
        "",
        " ",
        "\x00\x01",
        "👩‍👩‍👧" * 20,
        "\u202e\u200b",
        "é" * 500,
        "<|im_end|><|im_start|>",
        "{{ raise }}",
        "\n" * 50,
    ]
)
odd_value = odd_text | json_values


def mutated(base: dict, fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A valid body with up to two fields replaced by odd or wrong values: reaches the generation path."""
    return st.dictionaries(st.sampled_from(sorted(fields)), odd_value, max_size=2).flatmap(
        lambda keys: st.fixed_dictionaries({k: fields[k] for k in keys}).map(
            lambda changed: {**base, **changed}
        )
    )


near_generate = mutated(
    {"text": "Hi", "sampling_params": {"max_new_tokens": 3}},
    {
        "text": odd_text,
        "input_ids": st.lists(st.integers(0, 49151), min_size=1, max_size=6),
        "stream": st.booleans(),
        "return_logprob": st.booleans(),
        "top_logprobs_num": st.integers(-1, 25),
        "logprob_start_len": st.integers(-3, 5),
        "sampling_params": st.fixed_dictionaries(
            {"max_new_tokens": st.integers(0, 3)},
            optional={
                "temperature": st.floats(0, 2),
                "top_k": st.integers(-2, 5),
                "stop": odd_value,
                "n": st.integers(0, 3),
                "regex": st.sampled_from(["[a-z]{1,3}", "(", "a*", ""]) | odd_value,
                "seed": odd_value,
                "json_schema": st.sampled_from(['{"type": "integer"}', "{", '{"type": "nope"}'])
                | odd_value,
            },
        ),
    },
)
near_completion = mutated(
    {"model": "default", "prompt": "Hi", "max_tokens": 3},
    {
        "prompt": odd_text
        | st.lists(odd_text, max_size=3)
        | st.lists(st.integers(0, 49151), max_size=4),
        "stream": st.booleans(),
        "n": st.integers(0, 3),
        "logprobs": st.integers(-1, 6),
        "stop": odd_value,
        "temperature": st.floats(0, 2),
        "echo": st.booleans(),
        "seed": odd_value,
        "model": odd_text,
    },
)
near_chat = mutated(
    {
        "model": "default",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
    },
    {
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "system", "x"]), "content": odd_text}
            ),
            max_size=4,
        ),
        "stream": st.booleans(),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(-1, 25),
        "n": st.integers(0, 3),
        "response_format": st.sampled_from(
            [{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}]
        )
        | odd_value,
        "stop": odd_value,
        "tools": odd_value,
        "stream_options": odd_value,
    },
)
ROUTES = {
    "/generate": near_generate | generate_bodies,
    "/v1/completions": near_completion | completion_bodies,
    "/v1/chat/completions": near_chat | chat_bodies,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    # A small pool refuses huge max_tokens; the timeout bounds any valid request that runs long.
    srv = ServerProcess(
        ["--model-path", tiny_model_dir, "--max-total-tokens", "1024"]
        + ["--request-timeout", "20", "--log-level", "error"],
        tmp_path_factory.mktemp("fuzz"),
    )
    yield srv
    srv.stop()


def _bound_max_tokens(path: str, body):
    """Valid bodies run for real: keep their output short (an unset max_tokens defaults to 128 or more).
    Ints past the pool stay: they must be refused."""
    if not isinstance(body, dict):
        return body
    if path == "/generate":
        body.setdefault("sampling_params", {})
        holder, keys = body["sampling_params"], ("max_new_tokens",)
    else:  # max_completion_tokens is chat-only: adding it to a completion would make it a 400
        holder, keys = (
            body,
            ("max_tokens",)
            if path == "/v1/completions"
            else ("max_tokens", "max_completion_tokens"),
        )
    if isinstance(holder, dict):
        for key in keys:
            value = holder.setdefault(key, 4)
            if type(value) is int and 8 < value <= 2048:
                holder[key] = 8
    return body


def send(
    server: ServerProcess, path: str, body=None, content: bytes | None = None
) -> httpx.Response:
    kw = {"content": content} if content is not None else {"content": json.dumps(body).encode()}
    r = httpx.post(
        server.url + path, headers={"Content-Type": "application/json"}, timeout=120, **kw
    )
    counts.setdefault(path, {}).setdefault(r.status_code, 0)
    counts[path][r.status_code] += 1
    assert r.status_code < 500, (
        path,
        str(body if content is None else content)[:300],
        r.status_code,
        r.text[:300],
    )
    if r.status_code >= 400:
        err = r.json()["error"]
        assert (
            set(err) >= {"message", "type"} and isinstance(err["message"], str) and err["message"]
        )
    return r


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzzed_bodies_never_5xx(server, path):
    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=ROUTES[path])
    def check(body):
        send(server, path, _bound_max_tokens(path, body))

    check()
    print(
        f"\n{path}: {sum(counts[path].values())} fuzzed requests, status counts {dict(sorted(counts[path].items()))}"
    )
    assert sum(counts[path].values()) >= NUM_EXAMPLES
    assert counts[path].get(200, 0) >= 5  # the fuzz reached generation, not only the validators
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


@pytest.mark.parametrize("path", list(ROUTES))
def test_raw_bytes_never_5xx(server, path):
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        content=st.binary(max_size=64)
        | st.sampled_from(
            [
                b"",
                b"{",
                b"[" * 5000 + b"]" * 5000,
                b'{"text": "\xff"}',
                b'{"text": 1e999}',
                b'{"text": "a", "text": 2}',
                b"\xef\xbb\xbf{}",
                b"null",
                b'"\\ud800"',
            ]
        )
    )
    def check(content):
        send(server, path, content=content)

    check()


def test_zz_healthy_and_nothing_leaked_after_fuzz(server):
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    ok = httpx.post(
        server.url + "/generate",
        timeout=120,
        json={"text": "Hello", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
    )
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 3
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    info = httpx.get(server.url + "/get_server_info", timeout=60).json()
    assert info["kv_pages_free"] == info["kv_pages_total"] and info["integrity_ok"], info
    assert server.proc.poll() is None
