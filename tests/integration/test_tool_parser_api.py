"""--tool-call-parser on a real server with the real model: with tool_choice auto the answer runs
unconstrained and the parser reads the calls from its text (they validate against the tools'
schemas with `jsonschema`; the stream's deltas reassemble to the whole answer), and tool_choice
required is still grammar-constrained (valid calls whatever the model would write)."""

import json

import jsonschema
import openai
import pytest
from conftest_server import ServerProcess
from test_agent_api import SCHEMAS, TOOLS, few_shot, streamed

pytestmark = pytest.mark.integration
ROME = ("get_weather", {"city": "Rome", "unit": "celsius"})


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    srv = ServerProcess(
        ["--tool-call-parser", "hermes", "--max-total-tokens", "4096", "--log-level", "warning"],
        tmp_path_factory.mktemp("tool_parser"),
    )
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300)
    srv.stop()


def valid(calls) -> list[tuple[str, dict]]:
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def test_auto_reads_the_calls_from_free_text(client):
    kw = dict(model="default", messages=few_shot(), tools=TOOLS, max_tokens=48, temperature=0)
    r = client.chat.completions.create(n=2, **kw)  # n > 1: each choice its own parser
    assert [c.finish_reason for c in r.choices] == ["tool_calls"] * 2, r.choices
    assert [valid(c.message.tool_calls) for c in r.choices] == [[ROME]] * 2
    choice = r.choices[0]
    content, calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and content == (choice.message.content or "")
    whole = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [(name, args) for _, name, args in calls] == whole
    assert all(cid.startswith("call_") for cid, _, _ in calls)


def test_required_stays_grammar_constrained(client):
    # the same conversation (its prompt cached): the grammar writes the Hermes envelope, read by
    # the grammar's own parser
    kw = dict(
        model="default",
        messages=few_shot(),
        tools=TOOLS,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    whole = valid(r.choices[0].message.tool_calls)
    content, calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and not content
    assert [(name, json.loads(args)) for _, name, args in calls] == whole
