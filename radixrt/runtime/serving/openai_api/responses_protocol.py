"""POST /v1/responses' body (OpenAI's Responses API, as SGLang and vLLM serve it): strict pydantic
for the top-level fields, as protocol.py's bodies; the items of `input` and the tools are checked
by responses_items.py, which names the item and field at fault.

Unknown top-level fields (`include`, `prompt_cache_key`, `service_tier`, ...) are accepted and
ignored, named in the X-Radixrt-Ignored-Fields header as on the chat route.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.request.option_checks import MAX_CACHE_SALT_CHARS

MAX_ID_CHARS = 128  # a response id (ours are "resp_" + 48 hex digits)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class TextFormat(_Strict):
    """text.format: plain text, any JSON object, or JSON matching `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, not acted on


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    background: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # what to add to the output (logprobs, encrypted reasoning): nothing is; the Agents SDK sends []
    include: list[str] | None = None
    # echoed; a reasoning parser (--reasoning-parser) decides whether thinking is separated
    reasoning: dict[str, Any] | None = None
    # vLLM's: KV is shared only between requests of the same salt (core/namespaces.py); a stored
    # response is its salt's
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    # SGLang / vLLM sampling extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def ignored_fields(self) -> list[str]:
        return sorted([*(self.model_extra or {}), *(["include"] if self.include else [])])

    def sampling_extras(self) -> dict[str, Any]:
        """The fields that go to the chat request as they are."""
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "user")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}
