"""The Responses API (/v1/responses) against a real server and the real model, driven by the real
`openai` client and the OpenAI Agents SDK.

Truth: the `openai` package's own types (a raw answer validates as openai.types.responses.Response,
every stream event as a ResponseStreamEvent; the SDK's stream helper parses a text.format's
output), `jsonschema` for tool-call arguments and structured output, the scheduler's exact
cached_tokens (--enable-cache-report) for previous_response_id's cache hits, /get_server_info's
abort count for cancel, and an agent's tool being called with arguments its schema accepts.
"""

import json
import time

import httpx
import jsonschema
import openai
import pytest
from conftest_server import DEFAULT_SERVER_ARGS
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

pytestmark = pytest.mark.integration
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}
EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get(DEFAULT_SERVER_ARGS)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)


def post(server, body, path="/v1/responses"):
    return httpx.post(server.url + path, json=body, timeout=300)


def info(server):
    return httpx.get(server.url + "/get_server_info", timeout=30).json()


def test_create_retrieve_and_the_response_shape(server, client):
    raw = post(
        server,
        {
            "model": "default",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
            "instructions": "You are brief.",
            "max_output_tokens": 6,
            "temperature": 0,
            "metadata": {"case": "shape"},
            "include": [],
        },
    )
    assert raw.status_code == 200, raw.text
    assert "X-Radixrt-Ignored-Fields" not in raw.headers  # the Agents SDK's include: []
    resp = Response.model_validate(raw.json())
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.instructions == "You are brief." and resp.metadata == {"case": "shape"}
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
        assert resp.usage.output_tokens == 6
    u = resp.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens > 0
    assert u.output_tokens_details.reasoning_tokens == 0
    got = client.responses.retrieve(resp.id)
    assert got.model_dump() == resp.model_dump()


def test_stream_events_are_the_sdks(server, client):
    events = list(
        client.responses.create(
            model="default",
            input="Count to three.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    raw = [e.model_dump() for e in events]
    for e in raw:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in raw] == list(range(len(raw)))
    kinds = [e["type"] for e in raw]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    deltas = "".join(e["delta"] for e in raw if e["type"] == "response.output_text.delta")
    assert deltas == final.output_text and deltas
    assert client.responses.retrieve(final.id).output_text == deltas


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=150)


def test_stream_helper_parses_text_format_json_schema(client):
    with client.responses.stream(
        model="default",
        input="Invent a person.",
        text_format=Person,  # sent as text.format json_schema, strict
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.status == "completed" and final.text.format.type == "json_schema"
    jsonschema.validate(json.loads(final.output_text), Person.model_json_schema())
    assert isinstance(final.output_parsed, Person)


def _calls(resp):
    return [o for o in resp.output if o.type == "function_call"]


def test_previous_response_id_is_served_from_the_cache(server, client):
    page = info(server)["page_size"]
    common = dict(model="default", max_output_tokens=8, temperature=0, instructions="Be brief.")
    first = client.responses.create(input="Name a fruit.", **common)
    second = client.responses.create(
        input="Name another one.", previous_response_id=first.id, **common
    )
    assert second.usage.input_tokens > first.usage.total_tokens
    # the previous prompt and output (but the last output token, never fed) from the cache
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.total_tokens - page
    third = client.responses.create(input="And one more.", previous_response_id=second.id, **common)
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.total_tokens - page


def test_function_tool_streamed_then_its_result(server, client):
    events = list(
        client.responses.create(
            model="default",
            input="What's the weather in Rome?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=40,
            temperature=0,
            stream=True,
        )
    )
    for e in events:
        EVENT.validate_python(e.model_dump())
    resp = events[-1].response
    assert events[-1].type == "response.completed"
    (call,) = _calls(resp)
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == deltas == call.arguments
    assert resp.tools[0].name == "get_weather" and resp.tool_choice == "required"

    # the call's result continues it: the call, as generated, is served from the cache
    after = client.responses.create(
        model="default",
        previous_response_id=resp.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    page = info(server)["page_size"]
    assert after.usage.input_tokens_details.cached_tokens >= resp.usage.total_tokens - page
    assert after.output_text and not _calls(after)


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": "x", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": [{"type": "computer_call", "id": "c"}]}, 400, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": "x", "temperature": "hot"}, 400, "temperature"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        (
            {"input": "x", "tools": [WEATHER], "text": {"format": {"type": "json_object"}}},
            400,
            "text.format",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            400,
            "text.format.schema",
        ),
        ({"input": "x", "background": True, "store": False}, 400, "background"),
        ({"input": [{"role": "user", "content": "x"}] * 3000}, 400, "input"),
    ],
)
def test_bad_requests_name_the_field(server, body, status, param):
    r = post(server, {"model": "default", "max_output_tokens": 2, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_ids_are_404_and_the_server_serves_on(server, client):
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_" + "0" * 48)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    assert client.responses.create(model="default", input="Hi", max_output_tokens=2).output_text


def test_store_is_per_tenant(server, client):
    resp = client.responses.create(
        model="default", input="Hi", max_output_tokens=2, extra_body={"cache_salt": "tenant-a"}
    )
    assert client.responses.retrieve(resp.id, extra_query={"cache_salt": "tenant-a"}).id == resp.id
    for query in (None, {"cache_salt": "tenant-b"}):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(resp.id, extra_query=query)
    r = httpx.get(f"{server.url}/v1/responses/{resp.id}", params={"cache_salt": "s" * 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    # the salt in a header, which no URL (and so no proxy's or access log) records
    url = f"{server.url}/v1/responses/{resp.id}"
    assert httpx.get(url, headers={"X-Cache-Salt": "tenant-a"}).json()["id"] == resp.id
    assert httpx.get(url, headers={"X-Cache-Salt": "tenant-b"}).status_code == 404
    r = httpx.get(url, headers={"X-Cache-Salt": "s" * 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    with pytest.raises(openai.NotFoundError):  # another tenant cannot continue it either
        client.responses.create(model="default", input="x", previous_response_id=resp.id)
    unstored = client.responses.create(
        model="default", input="Hi", max_output_tokens=2, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_background_and_cancel(server, client):
    aborted = info(server)["num_requests_aborted"]
    long_text = {"type": "object", "properties": {"s": {"type": "string", "minLength": 2000}}}
    resp = client.responses.create(
        model="default",
        input="Write a long story.",
        background=True,
        max_output_tokens=1000,
        text={"format": {"type": "json_schema", "name": "story", "schema": long_text}},
    )
    assert resp.status in ("queued", "in_progress") and resp.background
    cancelled = client.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(resp.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # no longer in progress
        client.responses.cancel(resp.id)
    deadline = time.monotonic() + 30  # the abort reaches the scheduler after the answer
    while (now := info(server))["num_requests_aborted"] == aborted and time.monotonic() < deadline:
        time.sleep(0.2)
    assert now["num_requests_aborted"] == aborted + 1
    assert now["num_running"] == now["num_waiting"] == 0

    done = client.responses.create(
        model="default", input="Hi", background=True, max_output_tokens=3
    )
    deadline = time.monotonic() + 60
    while done.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        done = client.responses.retrieve(done.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    with pytest.raises(openai.BadRequestError):  # finished: nothing to cancel
        client.responses.cancel(done.id)
    sync = client.responses.create(model="default", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):  # not a background response
        client.responses.cancel(sync.id)


# ----------------------------------------------------------------- the OpenAI Agents SDK
def _run_agent(server, model_class):
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is 22 degrees and sunny in {city}."

    agent = Agent(
        name="weather",
        instructions="You answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=model_class(
            model="default",
            openai_client=openai.AsyncOpenAI(
                base_url=server.url + "/v1", api_key="none", timeout=300
            ),
        ),
        # required makes the small model call; stopping at the first tool's output ends the run
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, "What's the weather in Paris?")
    assert len(calls) == 1
    jsonschema.validate({"city": calls[0]}, WEATHER_PARAMS)
    assert result.final_output == f"It is 22 degrees and sunny in {calls[0]}."


def test_agents_sdk_over_the_responses_api(server):
    from agents import OpenAIResponsesModel

    _run_agent(server, OpenAIResponsesModel)


def test_agents_sdk_over_chat_completions(server):
    from agents import OpenAIChatCompletionsModel

    _run_agent(server, OpenAIChatCompletionsModel)
