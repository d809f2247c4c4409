"""OpenAI tool calling on the chat route: the request's tools checked, rendered into the prompt, and
the grammar that makes a call impossible to break.

Format: when the model's chat template renders `tools` itself, it gets them (and the messages as
OpenAI sends them); otherwise (SmolLM2's template has no tools) the fallback, Hermes-style: the
tools as JSON inside `<tools></tools>` in the system message, calls as `<tool_call>\n{"name": ...,
"arguments": ...}\n</tool_call>`, tool results as `<tool_response>` messages. Either way the model's
calls are read in that call format (tool_parsers/) and constrained by it
(constrained/tool_call_regex.py): with tool_choice `required` or a named function from the first
token, with `auto` from the moment the model opens `<tool_call>` (openai_chat.py runs that as a
second phase over the cached prefix).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.constrained.tool_call_regex import CLOSE, OPEN, tool_call_spec
from radixrt.runtime.serving.http.protocol import APIError

MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
FALLBACK_INSTRUCTIONS = (
    "You may call one or more functions to assist with the user query. The functions are described "
    "inside <tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call a function, answer with its name "
    "and arguments as a JSON object inside <tool_call></tool_call> tags:\n"
    + OPEN
    + '\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    + CLOSE
)


@dataclass
class ToolPlan:
    # the request's tools, as sent ({"type": "function", "function": {...}})
    tools: list[dict[str, Any]]
    mode: str  # "none" | "auto" | "required" | "named"
    parallel: bool
    names: list[str]  # the callable tools (one for "named")
    params: dict[str, dict]  # name -> parameter schema

    def grammar(self, opened: bool) -> str:
        """The tool_call_grammar sampling parameter for the callable tools."""
        return tool_call_spec([(n, self.params[n]) for n in self.names], self.parallel, opened)


def plan_tools(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None
) -> ToolPlan | None:
    """Check tools / tool_choice / parallel_tool_calls (a 400 naming the field); None without
    tools."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise APIError("tool_choice needs tools", param="tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise APIError(f"at most {MAX_TOOLS} tools", param="tools")
    params: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(
                f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', param="tools"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise APIError(
                f"tools[{i}].function.name must match [A-Za-z0-9_-]{{1,64}}", param="tools"
            )
        if name in params:
            raise APIError(f"tools[{i}]: two tools are named {name!r}", param="tools")
        schema = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise APIError(
                f"tools[{i}].function.parameters must be a JSON schema of an object", param="tools"
            )
        params[name] = schema
    names = list(params)
    if tool_choice in (None, "auto"):
        mode = "auto"
    elif tool_choice in ("none", "required"):
        mode = tool_choice
    elif (
        isinstance(tool_choice, dict)
        and tool_choice.get("type") == "function"
        and isinstance(tool_choice.get("function"), dict)
    ):
        name = tool_choice["function"].get("name")
        if name not in params:
            raise APIError(
                f"tool_choice names {name!r}, which is not one of the tools", param="tool_choice"
            )
        mode, names = "named", [name]
    else:
        raise APIError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
            '{"name": ...}}',
            param="tool_choice",
        )
    return ToolPlan(tools, mode, parallel is not False, names, params)


def template_renders_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", "{}")
    try:
        args_obj = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        raise APIError(
            "an assistant message's tool_calls[].function.arguments is not JSON", param="messages"
        ) from None
    return (
        f"{OPEN}\n"
        f"{json.dumps({'name': fn.get('name'), 'arguments': args_obj}, ensure_ascii=False)}\n"
        f"{CLOSE}"
    )


def fallback_messages(
    messages: list[dict[str, Any]], plan: ToolPlan | None
) -> list[dict[str, Any]]:
    """OpenAI messages (role, content, tool_calls, tool_call_id, name) -> plain role/content
    messages in the fallback format, the tools described in the system message."""
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            content = "\n".join(
                [content] * bool(content) + [_call_text(c) for c in m["tool_calls"]]
            )
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append(
            {"role": role, "content": content, **({"name": m["name"]} if m.get("name") else {})}
        )
    if plan is not None:
        described = FALLBACK_INSTRUCTIONS.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in plan.tools)
        )
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
