"""HTTP request bodies (pydantic, strict: "0.5" is not a number, unknown fields are refused) and the
OpenAI-style error body every 4xx/5xx carries: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radixrt.runtime.request.option_checks import MAX_CACHE_SALT_CHARS
from radixrt.runtime.request.request_error import RequestError


class APIError(Exception):
    """An answer other than 200: raised anywhere in request handling, rendered by the server."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ):
        super().__init__(message)
        self.message, self.status, self.type, self.param = message, status, type, param
        self.code = code if code is not None else status

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_value_error(e: ValueError) -> APIError:
    """SamplingParams and friends raise ValueError naming the parameter: keep the name as
    `param`."""
    if isinstance(e, RequestError):
        return APIError(str(e), 400, param=e.param, code=e.code)
    m = re.search(r"sampling parameters? (\w+)", str(e))
    return APIError(str(e), 400, param=m.group(1) if m else None)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def parse_body(
    model: type[BaseModel], body: bytes, precheck: Callable[[dict], None] | None = None
) -> Any:
    """Validate a JSON body into model, or raise APIError 400 naming the first bad field.

    precheck: the route's bounds on the plain parse (an APIError refuses the body) before the
    model's validation, which builds every nested value again (300,000 one-token prompts grew the
    process by ~250 MB that it kept; orjson's parse of them takes ~20 MB and gives them back)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"request body is not valid UTF-8 (byte {e.start})") from None
    if precheck is not None:
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError:
            raw = None  # the model's validation names what is wrong with it
        if isinstance(raw, dict):
            precheck(raw)
        del raw
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        if first["type"] == "json_invalid":
            raise APIError(f"request body is not valid JSON: {first['msg']}") from None
        # drop pydantic's union-member tags ("str", "list[int]") from the location
        loc = [str(x) for x in first["loc"] if not _is_union_tag(x)]
        where = ".".join(loc) or "body"
        raise APIError(f"{where}: {first['msg']}", param=loc[0] if loc else None) from None


def _is_union_tag(x: Any) -> bool:
    """pydantic names the union member in an error's location ("str", "list[int]", "TextPart")."""
    x = str(x)
    return (
        x in ("str", "int", "float", "bool", "none")
        or x.startswith(("list[", "dict[", "function-"))
        or x[:1].isupper()
    )


# ----------------------------------------------------------------- SGLang-native /generate
class _BootstrapFields(BaseModel):
    """SGLang's prefill-decode disaggregation fields (sglang-router's PD mode adds them): the
    prefill server's bootstrap address and the room both servers know the request by."""

    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None

    def bootstrap(self) -> tuple[str | None, int | None, int | None]:
        return self.bootstrap_host, self.bootstrap_port, self.bootstrap_room


class GenerateRequest(_BootstrapFields, _Strict):
    # unknown top-level fields are ignored: sglang-router forwards SGLang's whole request shape
    # (model, log_metrics, lora_path, ... at their defaults); sampling_params and every known field
    # stay strict
    model_config = ConfigDict(extra="allow", strict=True)
    text: Union[str, list[str], None] = None
    input_ids: Union[list[int], list[list[int]], None] = None
    sampling_params: Union[dict[str, Any], list[dict[str, Any]], None] = None
    stream: bool = False
    return_logprob: Union[bool, list[bool]] = False
    logprob_start_len: Union[int, list[int], None] = None
    top_logprobs_num: Union[int, list[int]] = 0
    return_text_in_logprobs: bool = False
    # accepted for SGLang compatibility; ids are assigned here
    rid: Union[str, list[str], None] = None
    program_id: str | None = None
    # radixrt's: keep this conversation's turns cached (core/sessions.py)
    session_id: str | None = None
    session_params: dict[str, Any] | None = None  # SGLang's shape of the same: {"id": ...}
    # SGLang's: the LoRA adapter (by name) of every prompt, or one per prompt (None: the base)
    lora_path: Union[str, list[Union[str, None]], None] = None
    # vLLM's: KV is shared only between requests of the same salt (core/namespaces.py)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    # SGLang's and vLLM's: under --enable-priority-scheduling, the order of admission
    priority: int | None = Field(default=None, ge=-(2**31), lt=2**31)

    def session(self) -> str | None:
        """session_id, or SGLang's session_params.id."""
        if self.session_params is not None and self.session_id is not None:
            raise APIError("give session_id or session_params, not both", param="session_params")
        sid = (self.session_params or {}).get("id") if self.session_id is None else self.session_id
        if sid is not None and not isinstance(sid, str):
            raise APIError("session_params.id must be a string", param="session_params")
        return sid


class LoraAdapterRequest(_Strict):
    """POST /load_lora_adapter (both fields) and /unload_lora_adapter (lora_name)."""

    lora_name: str = Field(min_length=1)
    lora_path: str | None = None


class ConcatAndAppendRequest(_Strict):
    src_rids: list[str]
    dst_rid: str


# SGLang's body has more knobs (activities, ...): those are ignored
class ProfileRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    output_dir: str | None = None
    num_steps: int | None = None


# ----------------------------------------------------------------- OpenAI-compatible
class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "grammar"]
    json_schema: JsonSchemaSpec | None = None
    grammar: str | None = None  # type "grammar": a Lark (or GBNF) grammar, enforced by llguidance


class _SamplingFields(_BootstrapFields, _Strict):
    """Sampling fields shared by both OpenAI routes (with SGLang's extras). Unknown top-level fields
    are accepted and ignored (clients send metadata, user, reasoning_effort, ...): `ignored_fields`
    names them for the route's warning header and log."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # SGLang / vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None  # SGLang's: a context-free grammar (GBNF or Lark)
    # radixrt's: keep this conversation's turns cached (core/sessions.py)
    session_id: str | None = None
    # vLLM's: KV is shared only between requests of the same salt (core/namespaces.py)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    # SGLang's and vLLM's: under --enable-priority-scheduling, the order of admission
    priority: int | None = Field(default=None, ge=-(2**31), lt=2**31)
    # vLLM's beam search: best_of (or n) beams wide, n returned
    use_beam_search: bool = False
    best_of: int | None = None
    length_penalty: float | None = None
    early_stopping: Union[bool, str, None] = None

    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16  # OpenAI's default for legacy completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    # an earlier answer's thinking, as clients send it back: not rendered (reasoning models'
    # templates drop earlier thinking)
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def as_dict(self) -> dict[str, Any]:
        """The message as a chat template takes it: OpenAI's `developer` role is `system` to a
        template."""
        d: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        for key in ("name", "tool_call_id", "tool_calls"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # passed to the chat template (e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None
    # SGLang's, under --reasoning-parser: the thinking in reasoning_content (false: left in
    # content); stream it as it comes (false: in one delta once it ends)
    separate_reasoning: bool = True
    stream_reasoning: bool = True
