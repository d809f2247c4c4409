"""HTTP protocol pieces without a server: request validation and error bodies, OpenAI -> sampling
params, result accumulation, SSE framing, the CLI flags, the ipc dir, the serving messages."""

from __future__ import annotations

import json
import os
import shutil
import stat

import msgspec
import pytest

from radixrt.runtime import messages
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.http_io import raise_error, sse
from radixrt.runtime.serving.http.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    from_value_error,
    parse_body,
)
from radixrt.runtime.serving.openai_api.openai_sampling import (
    JSON_OBJECT_LARK,
    constraint_from_request,
    sampling_dict,
)


def api_error(model, body: bytes | dict) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as e:
        parse_body(model, raw)
    assert e.value.status == 400 and set(e.value.body()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    return e.value


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body, param, words",
    [
        (
            {**CHAT, "temperature": "0.5"},
            "temperature",
            "valid number",
        ),  # strict: no string coercion
        ({**CHAT, "n": True}, "n", "valid integer"),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages", "messages.0.role"),
        (
            {
                **CHAT,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}
                ],
            },
            "messages",
            "messages.0.content",
        ),
        ({**CHAT, "messages": []}, "messages", "at least 1"),
        ({"model": "m"}, "messages", "Field required"),
        ({**CHAT, "stop": 3}, "stop", "stop"),
    ],
)
def test_chat_body_errors_name_the_field(body, param, words):
    e = api_error(ChatCompletionRequest, body)
    assert e.param == param and words in e.message, e.message
    # union member tags are not shown as fields
    assert "str" not in e.message.split(":")[0].split(".")


def test_body_not_json_not_utf8_not_object():
    assert "not valid JSON" in api_error(ChatCompletionRequest, b"{oops").message
    assert "UTF-8" in api_error(ChatCompletionRequest, b'{"model": "\xff"}').message
    assert api_error(GenerateRequest, b"[1, 2]").status == 400


def test_valid_bodies_parse():
    chat = parse_body(
        ChatCompletionRequest,
        json.dumps(
            {
                **CHAT,
                "messages": [
                    {"role": "system", "content": "s"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                ],
            }
        ).encode(),
    )
    assert [m.text() for m in chat.messages] == ["s", "ab"] and chat.temperature is None
    comp = parse_body(
        CompletionRequest, b'{"prompt": [[1, 2], [3]], "max_tokens": 5, "temperature": 1}'
    )
    assert comp.prompt == [[1, 2], [3]] and comp.temperature == 1.0
    gen = parse_body(
        GenerateRequest, b'{"input_ids": [1, 2], "sampling_params": {"temperature": 0}}'
    )
    assert gen.input_ids == [1, 2] and gen.text is None


def test_response_format_to_json_schema():
    req = parse_body(
        ChatCompletionRequest,
        json.dumps({**CHAT, "response_format": {"type": "json_object"}}).encode(),
    )
    # llguidance installed: real JSON
    assert constraint_from_request(req) == {"ebnf": JSON_OBJECT_LARK}
    grammar = parse_body(
        ChatCompletionRequest,
        json.dumps(
            {**CHAT, "response_format": {"type": "grammar", "grammar": 'start: "a"+'}}
        ).encode(),
    )
    assert constraint_from_request(grammar) == {"ebnf": 'start: "a"+'}
    empty = parse_body(
        ChatCompletionRequest, json.dumps({**CHAT, "response_format": {"type": "grammar"}}).encode()
    )
    with pytest.raises(APIError, match="needs grammar"):
        constraint_from_request(empty)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = parse_body(
        ChatCompletionRequest,
        json.dumps(
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema, "strict": True},
                },
            }
        ).encode(),
    )
    assert json.loads(constraint_from_request(req)["json_schema"]) == schema
    text = parse_body(
        ChatCompletionRequest, json.dumps({**CHAT, "response_format": {"type": "text"}}).encode()
    )
    assert constraint_from_request(text) == {}
    both = parse_body(
        ChatCompletionRequest,
        json.dumps({**CHAT, "regex": "a+", "response_format": {"type": "json_object"}}).encode(),
    )
    with pytest.raises(APIError, match="cannot be combined"):
        constraint_from_request(both)
    no_schema = parse_body(
        ChatCompletionRequest,
        json.dumps(
            {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}
        ).encode(),
    )
    with pytest.raises(APIError, match="schema"):
        constraint_from_request(no_schema)


def test_sampling_dict_maps_openai_names_to_sampling_params():
    req = parse_body(
        CompletionRequest,
        json.dumps(
            {
                "prompt": "x",
                "temperature": 0.3,
                "top_p": 0.9,
                "n": 2,
                "stop": "END",
                "presence_penalty": 0.5,
                "frequency_penalty": -0.5,
                "seed": 11,
                "top_k": 5,
                "min_p": 0.1,
                "repetition_penalty": 1.2,
                "min_tokens": 2,
                "stop_token_ids": [7],
                "ignore_eos": True,
                "skip_special_tokens": False,
                "regex": "[a-z]+",
            }
        ).encode(),
    )
    sp = SamplingParams.from_dict(sampling_dict(req, 33))
    expected = SamplingParams(
        max_new_tokens=33,
        min_new_tokens=2,
        temperature=0.3,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        frequency_penalty=-0.5,
        presence_penalty=0.5,
        repetition_penalty=1.2,
        stop=["END"],
        stop_token_ids=[7],
        ignore_eos=True,
        skip_special_tokens=False,
        seed=11,
        n=2,
        regex="[a-z]+",
    )
    assert sp == expected
    assert SamplingParams.from_dict(
        sampling_dict(parse_body(CompletionRequest, b'{"prompt": "x"}'), 4)
    ) == SamplingParams(max_new_tokens=4)  # unset OpenAI fields keep SGLang's defaults
    biased = sampling_dict(
        parse_body(CompletionRequest, b'{"prompt": "x", "logit_bias": {"1": 5}}'), 4
    )
    assert SamplingParams.from_dict(biased).logit_bias_pairs() == [(1, 5.0)]
    for bad in ({"x": 1}, {"1": 101}, {"1": float("nan")}, {str(i): 1 for i in range(301)}):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams.from_dict({"logit_bias": bad})


def test_unknown_top_level_fields_are_ignored_and_named():
    req = parse_body(
        ChatCompletionRequest,
        json.dumps({**CHAT, "metadata": {"a": 1}, "reasoning_effort": "low"}).encode(),
    )
    assert req.ignored_fields() == ["metadata", "reasoning_effort"]
    e = api_error(
        ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": "x", "wat": 1}]}
    )
    assert e.param == "messages" and "Extra inputs" in e.message  # nested objects stay strict


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", -1),
        ("top_p", 0),
        ("top_k", 0),
        ("n", 100),
        ("seed", -3),
        ("max_new_tokens", -1),
        ("presence_penalty", 3),
        ("min_p", 2),
        ("stop", [""]),
        ("regex", 5),
    ],
)
def test_value_errors_become_400_naming_the_parameter(name, value):
    with pytest.raises(ValueError) as e:
        SamplingParams.from_dict({name: value})
    err = from_value_error(e.value)
    assert err.status == 400 and err.param == name


def test_sequence_result_accumulates_and_maps_errors():
    res = SequenceResult("r")
    res.add(
        {
            "rid": "r",
            "new_ids": [1, 2],
            "text": "ab",
            "output_logprobs": [[-0.1, 1], [-0.2, 2]],
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "finished_reason": None,
        }
    )
    res.add(
        {
            "rid": "r",
            "new_ids": [3],
            "text": "c",
            "output_logprobs": [[-0.3, 3]],
            "cached_tokens": 4,
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "finished_reason": {"type": "length", "length": 3},
        }
    )
    assert (res.text, res.output_ids, res.completion_tokens, res.cached_tokens) == (
        "abc",
        [1, 2, 3],
        3,
        4,
    )
    assert [t for _, t in res.output_logprobs] == [1, 2, 3] and res.finished
    raise_error(res)  # a normal finish is no error
    refused = SequenceResult()
    refused.add(
        {"new_ids": [], "finished_reason": {"type": "abort", "message": "m"}, "error": "too long"}
    )
    with pytest.raises(APIError) as e:
        raise_error(refused)
    assert e.value.status == 400
    dead = SequenceResult()
    dead.add(
        {
            "new_ids": [],
            "finished_reason": {"type": "abort", "message": "x"},
            "error": "x",
            "server_error": True,
        }
    )
    with pytest.raises(APIError) as e:
        raise_error(dead)
    assert e.value.status == 503 and e.value.type == "server_error"


def test_sse_framing():
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'


def test_cli_flags_come_from_the_config():
    from radixrt.cli import build_parser

    args = build_parser().parse_args(
        [
            "serve",
            "--model-path",
            "/m",
            "--port",
            "4321",
            "--page-size",
            "16",
            "--max-total-tokens",
            "1024",
            "--chunked-prefill-size",
            "64",
            "--disable-radix-cache",
            "--attention-backend",
            "torch",
            "--schedule-policy",
            "fcfs",
            "--api-key",
            "k",
            "--log-level",
            "debug",
            "--dtype",
            "float32",
        ]
    )
    cfg = ServerConfig.from_cli_args(args)
    assert cfg == ServerConfig(
        model_path="/m",
        port=4321,
        page_size=16,
        max_total_tokens=1024,
        chunked_prefill_size=64,
        disable_radix_cache=True,
        attention_backend="torch",
        schedule_policy="fcfs",
        api_key="k",
        log_level="debug",
        dtype="float32",
    )
    defaults = ServerConfig.from_cli_args(build_parser().parse_args(["serve"]))
    assert defaults == ServerConfig() and defaults.host == "127.0.0.1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--schedule-policy", "random"])
    # SGLang spells the algorithm in capitals: choice flags take any case
    sgl_style = build_parser().parse_args(
        [
            "serve",
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            "3",
            "--quantization",
            "none",
        ]
    )
    cfg = ServerConfig.from_cli_args(sgl_style)
    assert (cfg.speculative_algorithm, cfg.speculative_num_draft_tokens, cfg.quantization) == (
        "ngram",
        3,
        "none",
    )


def test_ipc_dir_is_private():
    from radixrt.runtime.serving.launch.launch import IpcPaths

    ipc = IpcPaths.create()
    try:
        assert stat.S_IMODE(os.stat(ipc.dir).st_mode) == 0o700
        for path in (ipc.scheduler, ipc.detokenizer, ipc.tokenizer):
            assert path.startswith(f"ipc://{ipc.dir}/")
        assert len({ipc.scheduler, ipc.detokenizer, ipc.tokenizer}) == 3
    finally:
        shutil.rmtree(ipc.dir)


def test_serving_messages_round_trip_without_pickle():
    for msg in (
        messages.DetokenizeReq(
            rid="a", sampling_params={"stop": ["x"], "skip_special_tokens": False}
        ),
        messages.BatchTextOut(outputs=[messages.TextOut(rid="a", text="é", new_ids=[1])]),
        messages.FlushCacheOut(success=True),
        messages.HealthCheckReq(probe_id=3),
        messages.HealthCheckOut(probe_id=3),
        messages.ProcessReady(name="scheduler", info={"k": [1]}),
        messages.ProcessFailed(name="detokenizer", error="boom"),
    ):
        data = messages.encode(msg)
        # plain MessagePack on the wire, tagged with the message's name
        assert msgspec.msgpack.decode(data)["type"] == type(msg).__name__
        assert messages.decode(data) == msg


def test_logit_bias_keys_are_canonical_token_ids():
    for bad in ({"\u00b2": 1}, {"01": 1}, {"-1": 1}, {"1e3": 1}):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams.from_dict({"logit_bias": bad})
    assert SamplingParams.from_dict({"logit_bias": {"0": 1, 7: -2}}).logit_bias_pairs() == [
        (0, 1.0),
        (7, -2.0),
    ]
