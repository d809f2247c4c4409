"""The Responses API's items and the chat route's shapes, both ways (responses_items.py), the output
builder's stream events checked against the `openai` package's own types (the SDK parses them), the
store's bounds and tenants, and a continuation's prompt (responses_run.Prompts) on a ChatML-like
template. Expectations are written out by hand, not derived from the code under test."""

import asyncio
import json
import time

import pytest
from openai.types.responses import (
    Response,
    ResponseInputItemParam,
    ResponseOutputItem,
    ResponseStreamEvent,
    ResponseUsage,
)
from pydantic import TypeAdapter

from radixrt.runtime.serving.http.protocol import APIError, ChatCompletionRequest
from radixrt.runtime.serving.openai_api import responses_items as items
from radixrt.runtime.serving.openai_api.responses_protocol import TextConfig
from radixrt.runtime.serving.openai_api.responses_run import Prompts
from radixrt.runtime.serving.openai_api.responses_store import ResponsesStore, StoredResponse
from radixrt.runtime.serving.openai_api.responses_stream import OutputBuilder, SSEWriter
from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
)

EVENT = TypeAdapter(ResponseStreamEvent)
OUTPUT_ITEM = TypeAdapter(ResponseOutputItem)
INPUT_ITEM = TypeAdapter(ResponseInputItemParam)


# ----------------------------------------------------------------- input items -> chat messages
def test_string_input_is_one_user_message():
    assert items.input_messages("Hi there") == [{"role": "user", "content": "Hi there"}]
    assert items.input_messages(None) == []


def test_items_to_messages():
    given = [
        {"role": "developer", "content": "Be brief."},  # an easy message: no type
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather in "},
                {"type": "input_text", "text": "Paris?"},
            ],
        },
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {"type": "function_call", "call_id": "call_b", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "call_a", "output": '{"temp": 22}'},
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": [{"type": "input_text", "text": "3"}],
        },
        {"role": "user", "content": "Thanks"},
    ]
    for item in given:
        INPUT_ITEM.validate_python(item)  # what the SDK could send
    assert items.input_messages(given) == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temp": 22}'},
        {"role": "tool", "tool_call_id": "call_b", "content": "3"},
        {"role": "user", "content": "Thanks"},
    ]


def test_call_without_text_opens_an_assistant_turn():
    got = items.input_messages(
        [
            {"role": "user", "content": "1+2?"},
            {"type": "function_call", "call_id": "c", "name": "add", "arguments": "{}"},
        ]
    )
    assert got[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
        ],
    }
    ChatCompletionRequest.model_validate({"messages": got})  # the chat route takes them


@pytest.mark.parametrize(
    "given, param",
    [
        ([{"type": "web_search_call", "id": "x"}], "input[0].type"),
        ([{"role": "user", "content": "a"}, "text"], "input[1]"),
        ([{"role": "tool", "content": "a"}], "input[0].role"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}],
            "input[0].content[0].type",
        ),
        (
            [{"role": "user", "content": [{"type": "input_text", "text": 3}]}],
            "input[0].content[0].text",
        ),
        ([{"role": "user", "content": 5}], "input[0].content"),
        (
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}],
            "input[0].arguments",
        ),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "function_call_output", "call_id": "c", "output": None}], "input[0].output"),
        ([{"role": "user", "content": "x"}] * (items.MAX_INPUT_ITEMS + 1), "input"),
    ],
)
def test_bad_items_name_the_field(given, param):
    with pytest.raises(APIError) as e:
        items.input_messages(given)
    assert e.value.status == 400 and e.value.param == param
    assert param.split(".")[-1].split("[")[0] in e.value.message


# ----------------------------------------------------------------- tools, tool_choice, text.format
def test_tools_to_chat_and_echo():
    tool = {
        "type": "function",
        "name": "add",
        "description": "Add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "strict": True,
    }
    chat = items.chat_tools([tool])
    assert chat == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                "strict": True,
            },
        }
    ]
    assert items.echo_tools(chat) == [tool]
    assert items.chat_tools(None) is None and items.echo_tools(None) == []
    with pytest.raises(APIError) as e:
        items.chat_tools([tool, {"type": "web_search"}])
    assert e.value.param == "tools[1].type"


def test_tool_choice_and_text_format():
    assert items.chat_tool_choice("required") == "required"
    assert items.chat_tool_choice(None) is None
    assert items.chat_tool_choice({"type": "function", "name": "add"}) == {
        "type": "function",
        "function": {"name": "add"},
    }
    with pytest.raises(APIError) as e:
        items.chat_tool_choice({"type": "allowed_tools", "tools": []})
    assert e.value.param == "tool_choice"

    def fmt(f):
        return items.response_format(TextConfig.model_validate({"format": f}))

    assert items.response_format(None) is None and fmt({"type": "text"}) is None
    assert fmt({"type": "json_object"}) == {"type": "json_object"}
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert fmt({"type": "json_schema", "name": "p", "schema": schema, "strict": True}) == {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": schema, "strict": True},
    }
    with pytest.raises(APIError) as e:
        fmt({"type": "json_schema", "name": "p"})
    assert e.value.param == "text.format.schema"


def test_metadata_bounds():
    items.check_metadata({"k": "v"})
    with pytest.raises(APIError) as e:
        items.check_metadata({str(i): "v" for i in range(17)})
    assert e.value.param == "metadata"
    with pytest.raises(APIError):
        items.check_metadata({"k": "v" * 513})


def test_usage_shape():
    got = items.usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 6},
        },
        reasoning_tokens=2,
    )
    u = ResponseUsage.model_validate(got)
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (10, 4, 14)
    assert u.input_tokens_details.cached_tokens == 6
    assert u.output_tokens_details.reasoning_tokens == 2


# ----------------------------------------------------------------- output builder and stream events
def _feed_all(builder, batches, status="completed"):
    events = [e for batch in batches for e in builder.feed(batch)]
    return events + builder.finish(status)


def test_text_then_call_events_are_the_sdks():
    b = OutputBuilder()
    events = _feed_all(
        b,
        [
            [Content("Let me ")],
            [Content("check.")],
            [CallStart(0, "get_weather")],
            [ArgsDelta(0, '{"city": '), ArgsDelta(0, '"Paris"}')],
            [CallEnd(0)],
        ],
    )
    write = SSEWriter()
    for e in events:
        frame = write(e)
        head, data = frame.decode().split("\n", 1)
        assert head == f"event: {e['type']}" and data.startswith("data: ")
        EVENT.validate_python(json.loads(data[len("data: ") :]))
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e.get("output_index") for e in events] == [0] * 7 + [1] * 5
    assert events[4]["text"] == "Let me check."
    assert events[10]["arguments"] == '{"city": "Paris"}' and events[10]["name"] == "get_weather"
    assert events[7]["item"]["arguments"] == "" and events[7]["item"]["status"] == "in_progress"
    msg, call = b.items
    for item in b.items:
        OUTPUT_ITEM.validate_python(item)
    assert msg["content"][0]["text"] == "Let me check." and msg["status"] == "completed"
    assert call["arguments"] == '{"city": "Paris"}' and call["call_id"].startswith("call_")
    assert call["id"].startswith("fc_") and msg["id"].startswith("msg_")
    # output items are input items: the continuation's messages
    assert items.input_messages(b.items) == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        }
    ]


def test_whitespace_before_a_call_is_no_message():
    b = OutputBuilder()
    _feed_all(
        b, [[Content("\n")], [Content(" ")], [CallStart(0, "f"), ArgsDelta(0, "{}"), CallEnd(0)]]
    )
    assert [it["type"] for it in b.items] == ["function_call"]


def test_whitespace_only_answer_is_kept_and_cut_items_are_incomplete():
    b = OutputBuilder()
    _feed_all(b, [[Content("  ")]])
    assert b.items[0]["content"][0]["text"] == "  "
    b = OutputBuilder()
    events = _feed_all(b, [[CallStart(0, "f"), ArgsDelta(0, '{"a": 1')]], status="incomplete")
    assert b.items[0]["status"] == "incomplete" and b.items[0]["arguments"] == '{"a": 1'
    assert events[-1]["item"]["status"] == "incomplete"


def test_reasoning_item_events():
    b = OutputBuilder()
    events = b.reasoning("Think") + b.reasoning("ing.") + _feed_all(b, [[Content("42")]])
    for i, e in enumerate(events):
        EVENT.validate_python({**e, "sequence_number": i})
    assert [it["type"] for it in b.items] == ["reasoning", "message"]
    assert b.items[0]["content"] == [{"type": "reasoning_text", "text": "Thinking."}]
    OUTPUT_ITEM.validate_python(b.items[0])
    assert items.input_messages(b.items) == [{"role": "assistant", "content": "42"}]


def test_a_whole_response_validates():
    b = OutputBuilder()
    _feed_all(b, [[Content("Hello")]])
    Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": "m",
            "output": b.items,
            "tools": items.echo_tools(items.chat_tools([{"type": "function", "name": "f"}])),
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
    )


# ----------------------------------------------------------------- the store
def _entry(owner="o", size=0):
    return StoredResponse(owner, {"id": "r", "status": "completed", "pad": "x" * size})


def test_store_is_the_owners():
    store = ResponsesStore()
    store.put("r1", _entry("salt-a|"))
    assert store.get("r1", "salt-a|") is not None
    assert store.get("r1", "salt-b|") is None and store.get("r2", "salt-a|") is None


def test_store_bounds_count_bytes_and_time():
    store = ResponsesStore(max_entries=3)
    for i in range(5):
        store.put(f"r{i}", _entry())
    store.get("r2", "o")  # used: the oldest is now r3
    store.put("r5", _entry())
    assert [k for k in ("r0", "r1", "r2", "r3", "r4", "r5") if store.get(k, "o")] == [
        "r2",
        "r4",
        "r5",
    ]

    store = ResponsesStore(max_bytes=5000)
    for i in range(10):
        store.put(f"r{i}", _entry(size=1000))
    assert store.bytes <= 5000 and len(store) < 10 and store.get("r9", "o") is not None

    store = ResponsesStore(ttl_s=0.05)
    store.put("r", _entry())
    time.sleep(0.1)
    assert store.get("r", "o") is None and len(store) == 0


def test_a_running_background_response_is_never_evicted():
    """#56.6: another owner's puts evicted (and cancelled) a background response still running."""

    async def run():
        store = ResponsesStore(max_entries=1)
        task = asyncio.ensure_future(asyncio.sleep(60))
        store.put("bg", StoredResponse("o", {"status": "in_progress"}, task=task))
        store.put("other", _entry("p"))
        await asyncio.sleep(0)
        assert not task.cancelled() and store.get("bg", "o") is not None
        store.put("bg", _entry(), only_if_present=True)  # it ended: its answer replaces it
        assert not task.cancelled() and store.get("bg", "o").response["status"] == "completed"
        store.put("third", _entry("p"))  # now the least recently used go, down to the bound
        assert len(store) == 1 and store.get("third", "p") is not None
        task.cancel()

    asyncio.run(run())


def test_a_flooding_owner_pushes_out_only_its_own():
    """#56.6: 1,024 cheap responses of one tenant evicted every other tenant's. Now the owners over
    a quarter of the store lose their oldest first."""
    store = ResponsesStore(max_entries=40, max_bytes=400_000)
    for i in range(10):
        store.put(f"b{i}", _entry("b"))
    for i in range(1024):
        store.put(f"a{i}", _entry("a"))
    assert all(store.get(f"b{i}", "b") is not None for i in range(10))
    kept = [i for i in range(1024) if store.get(f"a{i}", "a") is not None]
    assert kept == list(range(1024 - 30, 1024))  # the rest of the store: its newest
    for i in range(7):  # bytes too: past 400,000 in all, c is over a quarter of them
        store.put(f"big{i}", _entry("c", size=60_000))
    assert store.bytes <= 400_000 and store.get("big0", "c") is None
    assert store.get("big6", "c") is not None
    assert all(store.get(f"b{i}", "b") is not None for i in range(10))


# ----------------------------------------------------------------- a continuation's prompt
class _Tok:
    """Characters as token ids (every text splits one way)."""

    def encode(self, text):
        return [ord(c) for c in text]


class _FakeChat:
    """ChatML, as SmolLM2's template renders it, with encode = characters."""

    def __init__(self):
        self.tm = self
        self.tokenizer = _Tok()

    async def encode(self, texts, add_special_tokens=False):
        return [self.tokenizer.encode(t) for t in texts]

    async def prompt_text(self, req, plan):
        text = "".join(f"<s>{m.role}\n{m.text()}</s>\n" for m in req.messages)
        return text + ("<s>assistant\n" if req.add_generation_prompt else "")


def _creq(messages):
    return ChatCompletionRequest.model_validate({"messages": messages})


@pytest.mark.parametrize(
    "output, tail, junction",
    [
        ("Hi!</s>", "Hi!</s>", "\n"),  # ended by its end-of-turn token
        ("Hi", "Hi", "</s>\n"),  # cut by max_output_tokens
    ],
)
def test_continuation_starts_with_the_previous_ids(output, tail, junction):
    chat = _FakeChat()
    prompts = Prompts(chat)
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hello"}]
    prev_text = asyncio.run(chat.prompt_text(_creq(first), None))
    # the previous request's ids: not what encoding its text gives (a different split)
    transcript = [-1] * len(prev_text) + [-2] * len(output)
    prev = StoredResponse(
        "o",
        {},
        conversation=first[1:] + [{"role": "assistant", "content": output.removesuffix("</s>")}],
        prompt_text=prev_text,
        transcript_ids=transcript,
        tail_text=tail,
    )
    msgs = [first[0], *prev.conversation, {"role": "user", "content": "More"}]
    ids, text = asyncio.run(prompts.prompt_for(_creq(msgs), None, "", prev, len(msgs) - 1))
    assert ids[: len(transcript)] == transcript
    assert (
        "".join(map(chr, ids[len(transcript) :])) == junction + "<s>user\nMore</s>\n<s>assistant\n"
    )
    assert text.endswith("<s>user\nMore</s>\n<s>assistant\n")

    # other instructions: the previous ids are not this conversation's start; the whole render
    msgs[0] = {"role": "system", "content": "Other"}
    ids, text = asyncio.run(prompts.prompt_for(_creq(msgs), None, "", prev, len(msgs) - 1))
    assert "".join(map(chr, ids)) == text
