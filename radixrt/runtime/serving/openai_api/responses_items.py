"""The Responses API's items and the chat route's shapes, both ways.

In: `input` (a string, or items: `message` with role user/system/developer/assistant and content as
a string or `input_text`/`output_text` parts; `function_call`; `function_call_output`; `reasoning`,
skipped as templates drop earlier thinking) -> chat messages (role, content, tool_calls,
tool_call_id), which the chat route renders. A function call joins the assistant message right
before it, so a message and the calls of one answer are one assistant turn. Responses tools,
tool_choice and text.format -> the chat request's tools, tool_choice and response_format.

Out: the answer's content and calls -> output items (`message` with `output_text` parts,
`function_call` with `call_id`, `name`, `arguments`; `reasoning` for a reasoning parser's
thinking), and the chat usage -> the Responses usage. Output items are valid input items, so
input_messages also turns a stored answer back into the messages its continuation renders.

Every refusal is a 400 whose param names the item and field (`input[2].content[0].type`).
"""

from __future__ import annotations

import json
from typing import Any

from radixrt.runtime.serving.http.protocol import APIError

MAX_INPUT_ITEMS = 2048
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits
ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")


def _need_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise APIError(f"{where} must be a string", param=where)
    return value


def _text_of(content: Any, where: str) -> str:
    """A string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of parts", param=where)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal":  # an earlier answer's refusal part
            texts.append(_need_str(part.get("refusal"), f"{at}.refusal"))
        elif kind in TEXT_PARTS:
            texts.append(_need_str(part.get("text"), f"{at}.text"))
        else:
            raise APIError(
                f"{at}.type {kind!r} is not supported: this server takes text parts "
                f"({', '.join(TEXT_PARTS)}) only",
                param=f"{at}.type",
            )
    return "".join(texts)


def _message(item: dict[str, Any], at: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise APIError(f"{at}.role must be one of {', '.join(ROLES)}", param=f"{at}.role")
    return {"role": role, "content": _text_of(item.get("content"), f"{at}.content")}


def _call(item: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = _need_str(item.get("call_id"), f"{at}.call_id")
    name = _need_str(item.get("name"), f"{at}.name")
    arguments = _need_str(item.get("arguments"), f"{at}.arguments")
    try:
        json.loads(arguments)
    except ValueError:
        raise APIError(f"{at}.arguments is not JSON", param=f"{at}.arguments") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_output(item: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = _need_str(item.get("call_id"), f"{at}.call_id")
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": _text_of(item.get("output"), f"{at}.output"),
    }


def input_messages(items: str | list[Any] | None) -> list[dict[str, Any]]:
    """`input` (or output items) -> chat messages."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if len(items) > MAX_INPUT_ITEMS:
        raise APIError(f"input has {len(items)} items; at most {MAX_INPUT_ITEMS}", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(f"{at} must be an object", param=at)
        kind = item.get("type", "message")  # an easy message has no type
        if kind == "message":
            out.append(_message(item, at))
        elif kind == "function_call":
            call = _call(item, at)
            if out and out[-1]["role"] == "assistant":  # the same answer's text, then its calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_call_output(item, at))
        elif kind != "reasoning":
            raise APIError(
                f"{at}.type {kind!r} is not supported: message, function_call, "
                "function_call_output or reasoning",
                param=f"{at}.type",
            )
    return out


# ----------------------------------------------------------------- tools and formats, to chat's
def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses function tools ({"type": "function", "name", ...}) -> the chat route's
    ({"type": "function", "function": {...}}); tool_calls.plan_tools checks the rest."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise APIError(
                f"tools[{i}].type {kind!r} is not supported: only function tools",
                param=f"tools[{i}].type",
            )
        fn = {"name": tool.get("name")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def echo_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools as a Response echoes them (FunctionTool)."""
    return [
        {
            "type": "function",
            "name": t["function"]["name"],
            "description": t["function"].get("description"),
            "parameters": t["function"].get("parameters"),
            "strict": t["function"].get("strict"),
        }
        for t in tools or []
    ]


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise APIError(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
        param="tool_choice",
    )


def response_format(text: Any) -> dict[str, Any] | None:
    """text.format (responses_protocol.TextFormat) -> the chat route's response_format."""
    fmt = None if text is None else text.format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise APIError("text.format json_schema needs schema", param="text.format.schema")
    spec = {"name": fmt.name or "response", "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise APIError(f"metadata has at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise APIError(
                f"metadata keys are at most {MAX_METADATA_KEY} characters, values "
                f"{MAX_METADATA_VALUE}",
                param="metadata",
            )


# ----------------------------------------------------------------- output items
def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; text None: just opened (a stream adds its part next)."""
    content = [] if text is None else [text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A reasoning parser's thinking (reasoning_parser.py) as a `reasoning` item."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def usage(chat_usage: dict[str, Any], reasoning_tokens: int = 0) -> dict[str, Any]:
    """The chat route's usage -> the Responses usage (reasoning_tokens: the thinking's, counted by
    a reasoning parser; 0 without one)."""
    prompt, completion = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    cached = chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": prompt,
        # every computed prompt token is kept in the radix cache
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt - cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt + completion,
    }
