"""The client libraries people use for structured output, against a real `radixrt serve` with nothing
changed but base_url: instructor (modes TOOLS, JSON_SCHEMA, JSON), LangChain's ChatOpenAI
(with_structured_output by json_schema and by function_calling, invoke, stream) and pydantic-ai (an
Agent with a tool and a structured output). Each library asks once (max_retries=0): the grammar
makes the first answer validate. What each library sends is recorded from its own HTTP client, so
the shapes these tests stand for ($defs/$ref tool parameters, strict schemas, named tool_choice,
max_completion_tokens, stream_options) are asserted, not assumed, and none of them is a field the
server ignored.

Truth: every result is an instance of its pydantic model and validates again on its own, its JSON
against the model's JSON schema (`jsonschema`).
"""

import json
from typing import Any

import httpx
import instructor
import jsonschema
import pytest
from client_models import Person
from conftest_server import DEFAULT_SERVER_ARGS
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition

pytestmark = pytest.mark.integration
MAX_TOKENS = 80
PERSON_TEXT = "John is 30 years old and lives at 1 Main St, Boston."


class Capital(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get(DEFAULT_SERVER_ARGS)


class Recorder:
    """The chat requests a library's own HTTP client sent, and any fields the server ignored."""

    def __init__(self):
        self.bodies: list[dict[str, Any]] = []
        self.ignored: list[str] = []

    def _request(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.content))

    def _response(self, response: httpx.Response) -> None:
        if "x-radixrt-ignored-fields" in response.headers:
            self.ignored.append(response.headers["x-radixrt-ignored-fields"])

    async def _arequest(self, request: httpx.Request) -> None:
        self._request(request)

    async def _aresponse(self, response: httpx.Response) -> None:
        self._response(response)

    def client(self) -> httpx.Client:
        hooks = {"request": [self._request], "response": [self._response]}
        return httpx.Client(event_hooks=hooks, timeout=300)

    def async_client(self) -> httpx.AsyncClient:
        hooks = {"request": [self._arequest], "response": [self._aresponse]}
        return httpx.AsyncClient(event_hooks=hooks, timeout=300)


@pytest.fixture
def rec():
    recorder = Recorder()
    yield recorder
    assert recorder.bodies, "the library sent no chat request"
    assert not recorder.ignored, f"the server ignored fields the library sent: {recorder.ignored}"


def check(obj: Any, model: type[BaseModel]) -> None:
    """An instance of model, whose JSON validates against the model's JSON schema on its own."""
    assert isinstance(obj, model), obj
    data = json.loads(obj.model_dump_json())
    jsonschema.validate(data, model.model_json_schema())
    # instructor answers with a subclass of the model: compare as the model
    assert model.model_validate(data).model_dump() == obj.model_dump()


def openai_client(server, rec: Recorder) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="none", http_client=rec.client())


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_schema_modes(server, rec, mode):
    client = instructor.from_openai(openai_client(server, rec), mode=mode)
    person, completion = client.chat.completions.create_with_completion(
        model="default",
        response_model=Person,
        messages=[{"role": "user", "content": f"Extract the person: {PERSON_TEXT}"}],
        max_retries=0,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    check(person, Person)
    (body,) = rec.bodies
    message = completion.choices[0].message
    if mode == instructor.Mode.TOOLS:  # the schema as a tool's parameters, the tool named
        assert body["tool_choice"] == {"type": "function", "function": {"name": "Person"}}
        assert "$defs" in body["tools"][0]["function"]["parameters"]
        raw = message.tool_calls[0].function.arguments
    else:
        assert body["response_format"]["type"] == "json_schema"
        assert "$defs" in body["response_format"]["json_schema"]["schema"]
        raw = message.content
    # written in the schema's declared order, as OpenAI writes it
    assert list(json.loads(raw)) == list(Person.model_fields)


def test_instructor_json_mode(server, rec):
    """Mode.JSON sends json_object and the schema in the prompt: the grammar guarantees a JSON
    object, the examples (ordinary few-shot messages) that it is this model's object."""
    client = instructor.from_openai(openai_client(server, rec), mode=instructor.Mode.JSON)
    shots = []
    for city, country in [("Berlin", "Germany"), ("Rome", "Italy")]:
        shots += [
            {"role": "user", "content": f"{city} is the capital of {country}."},
            {"role": "assistant", "content": json.dumps({"city": city, "country": country})},
        ]
    capital = client.chat.completions.create(
        model="default",
        response_model=Capital,
        messages=[*shots, {"role": "user", "content": "Paris is the capital of France."}],
        max_retries=0,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    check(capital, Capital)
    (body,) = rec.bodies
    assert body["response_format"] == {"type": "json_object"}
    assert '"country"' in body["messages"][0]["content"]  # instructor's schema in the prompt


def chat_model(server, rec: Recorder, max_tokens: int = MAX_TOKENS, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.url + "/v1",
        api_key="none",
        model="default",
        max_retries=0,
        temperature=0,
        max_tokens=max_tokens,
        http_client=rec.client(),
        **kw,
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(server, rec, method):
    llm = chat_model(server, rec).with_structured_output(Person, method=method)
    check(llm.invoke(f"Extract the person: {PERSON_TEXT}"), Person)
    (body,) = rec.bodies
    assert body["max_completion_tokens"] == MAX_TOKENS
    if method == "json_schema":  # strict, every object closed
        assert body["response_format"]["json_schema"]["strict"] is True
    else:
        assert body["tool_choice"]["function"]["name"] == "Person"
        assert body["parallel_tool_calls"] is False


def test_langchain_invoke_and_stream(server, rec):
    llm = chat_model(server, rec, max_tokens=16, stream_usage=True)
    whole = llm.invoke("Say hello in one short sentence.")
    assert isinstance(whole.content, str) and whole.content
    assert whole.response_metadata["finish_reason"] in ("stop", "length")
    chunks = list(llm.stream("Say hello in one short sentence."))
    streamed = chunks[0]
    for c in chunks[1:]:
        streamed += c
    assert streamed.content == whole.content
    assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]
    assert rec.bodies[1]["stream_options"] == {"include_usage": True}


def test_pydantic_ai_agent_with_a_tool(server, rec):
    model = OpenAIChatModel(
        "default",
        provider=OpenAIProvider(
            openai_client=AsyncOpenAI(
                base_url=server.url + "/v1", api_key="none", http_client=rec.async_client()
            )
        ),
    )
    agent = Agent(
        model,
        output_type=Person,
        instructions="Look up a person's age with lookup_age, then give the person's details.",
        model_settings={"max_tokens": MAX_TOKENS, "temperature": 0},
    )
    looked_up: list[str] = []

    async def until_used(ctx: RunContext, tool: ToolDefinition) -> ToolDefinition | None:
        # a lookup the agent needs once: offered until it has been made
        return None if looked_up else tool

    @agent.tool_plain(prepare=until_used)
    def lookup_age(name: str) -> int:
        """Look up a person's age by name."""
        looked_up.append(name)
        return 30

    result = agent.run_sync("Who is John? He lives at 1 Main St, Boston.")
    check(result.output, Person)
    returns = [
        part
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart) and part.tool_name == "lookup_age"
    ]
    assert len(looked_up) == 1 and len(returns) == 1
    first = rec.bodies[0]
    # pydantic-ai's output is a tool too: calls are required, its tools strict and with $defs
    assert first["tool_choice"] == "required"
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert tools["lookup_age"]["strict"] is True and "$defs" in tools["final_result"]["parameters"]
    assert len(rec.bodies) == 2
