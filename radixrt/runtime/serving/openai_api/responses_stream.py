"""A response's output items as the parser's events build them, and the Responses API's stream
events for each step (openai.types.responses' shapes: the SDK parses them).

OutputBuilder.feed takes the events a tool-call parser yields (tool_parsers/events.py: Content,
CallStart, ArgsDelta, CallEnd) and returns the stream events they make: a message item opens with
its output_text part at the first content (whitespace alone is held: before a call it is dropped),
its text goes out as output_text.delta, and it closes (output_text.done, content_part.done,
output_item.done) when a call starts or the output ends; a call is output_item.added,
function_call_arguments.delta per fragment, then .done and output_item.done. `reasoning` opens a
`reasoning` item with reasoning_text deltas (for a reasoning parser's thinking, before the answer).
A whole (non-streamed) answer feeds the same events and keeps only `items`.

SSEWriter numbers the events (sequence_number) and frames them as OpenAI does (`event:` + `data:`).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from radixrt.runtime.serving.openai_api import responses_items as items_of
from radixrt.runtime.serving.openai_api.chat_reasoning import Reasoning
from radixrt.runtime.serving.openai_api.tool_calls import new_call_id
from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
)


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item still growing (its text or arguments)
        self._held = ""  # leading whitespace of a message not yet opened

    def feed(self, events: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, Reasoning):  # the thinking, on the tool path (openai_chat_tools.py)
                out += self.reasoning(e.text)
            elif isinstance(e, Content):
                out += self._content(e.text)
            elif isinstance(e, CallStart):
                self._held = ""  # whitespace before a call is not an answer
                out += self._close("completed")
                item = items_of.call_item(
                    new_item_id("fc"), new_call_id(), e.name, "", "in_progress"
                )
                out += self._add(item)
            elif isinstance(e, ArgsDelta) and self._is_open("function_call"):
                self._open["arguments"] += e.text
                out.append(self._at("response.function_call_arguments.delta", delta=e.text))
            elif isinstance(e, CallEnd):
                out += self._close("completed")
        return out

    def reasoning(self, text: str) -> list[dict[str, Any]]:
        """Thinking text (a reasoning parser's): into the open reasoning item, or a new one."""
        out: list[dict[str, Any]] = []
        if not self._is_open("reasoning"):
            out += self._close("completed")
            out += self._add(items_of.reasoning_item(new_item_id("rs"), None, "in_progress"))
            self._open["content"].append({"type": "reasoning_text", "text": ""})
        self._open["content"][0]["text"] += text
        out.append(self._at("response.reasoning_text.delta", content_index=0, delta=text))
        return out

    def finish(self, status: str) -> list[dict[str, Any]]:
        """End of output: held whitespace is the answer when nothing else is; the open item closes
        with status ("completed", or "incomplete" when the output was cut)."""
        out: list[dict[str, Any]] = []
        if self._held and not self.items:
            text, self._held = self._held, ""
            out += self._content(text, hold=False)
        return out + self._close(status)

    # ------------------------------------------------------------------ steps
    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open["type"] == kind

    def _at(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event about the open item."""
        return {
            "type": kind,
            "item_id": self._open["id"],
            "output_index": len(self.items) - 1,
            **fields,
        }

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self._open = item
        added = {"type": "response.output_item.added", "output_index": len(self.items) - 1}
        return [{**added, "item": _copy(item)}]

    def _content(self, text: str, hold: bool = True) -> list[dict[str, Any]]:
        if not self._is_open("message"):
            if hold and not (self._held + text).strip():
                self._held += text
                return []
            text, self._held = self._held + text, ""
            out = self._close("completed")
            out += self._add(items_of.message_item(new_item_id("msg"), None, "in_progress"))
            part = items_of.text_part("")
            self._open["content"].append(part)
            out.append(self._at("response.content_part.added", content_index=0, part=dict(part)))
        else:
            out = []
        if text:
            self._open["content"][0]["text"] += text
            out.append(
                self._at("response.output_text.delta", content_index=0, delta=text, logprobs=[])
            )
        return out

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, out = self._open, []
        if item is None:
            return out
        if item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._at(
                    "response.output_text.done", content_index=0, text=part["text"], logprobs=[]
                )
            )
            out.append(self._at("response.content_part.done", content_index=0, part=dict(part)))
        elif item["type"] == "function_call":
            done = {"arguments": item["arguments"], "name": item["name"]}
            out.append(self._at("response.function_call_arguments.done", **done))
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out.append(self._at("response.reasoning_text.done", content_index=0, text=text))
        item["status"] = status
        done = {"type": "response.output_item.done", "output_index": len(self.items) - 1}
        out.append({**done, "item": _copy(item)})
        self._open = None
        return out


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as it is now (the builder keeps growing its own)."""
    return orjson.loads(orjson.dumps(item))


class SSEWriter:
    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
