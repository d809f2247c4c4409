"""Every message that crosses a process boundary, encoded with orjson (never pickle).

A message is a dataclass registered here; `encode` tags it with its class name and
`decode` rebuilds it, refusing any tag it does not know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from radixrt.runtime.request.options import RequestOptions

_TYPES: dict[str, type] = {}


def message(cls: type) -> type:
    cls = dataclass(cls)
    _TYPES[cls.__name__] = cls
    return cls


def encode(msg: Any) -> bytes:
    return orjson.dumps({"type": type(msg).__name__, "body": dataclasses.asdict(msg)})


def decode(data: bytes) -> Any:
    obj = orjson.loads(data)
    cls = _TYPES.get(obj.get("type")) if isinstance(obj, dict) else None
    if cls is None:
        raise ValueError(
            f"unknown message type {obj.get('type') if isinstance(obj, dict) else obj!r}"
        )
    return cls(**obj["body"])


@message
class TokenizedGenerateReq:
    """One sequence to generate (n>1 is expanded into n of these before the scheduler)."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_dict(), already validated
    # stream, logprobs, program/session/pin, LoRA, cache salt, bootstrap: built once at the entry
    options: RequestOptions = field(default_factory=RequestOptions)
    arrival_time: float = 0.0

    def __post_init__(self) -> None:
        try:
            self.options = RequestOptions.from_wire(self.options)  # a dict when decoded
        except TypeError:
            pass  # left as it came: intake refuses it, answering this rid (a 400)


@message
class AbortReq:
    rid: str


@message
class FlushCacheReq:
    pass


@message
class GetServerInfoReq:
    pass


@message
class GetCacheTreeReq:
    max_depth: int
    max_nodes: int


@message
class CacheTreeOut:
    view: dict[str, Any]  # core/cache_view.py's view (token ids), or {"error": ...}


@message
class TokenOut:
    """What one request produced in one step: only the delta."""

    rid: str
    new_ids: list[int]
    finished_reason: dict[str, Any] | None = None  # {"type": "stop"|"length"|"abort", ...}
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # drafts verified for it so far (jump-forward, tree, prompt lookup): steps, tokens kept
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    # (logprob, token_id) pairs for new_ids; top: list of [(logprob, token_id), ...] per new id
    output_logprobs: list[list[Any]] = field(default_factory=list)
    output_top_logprobs: list[list[list[Any]]] = field(default_factory=list)
    # prompt logprobs, sent once with the first delta when requested
    input_logprobs: list[list[Any]] | None = None
    input_top_logprobs: list[list[list[Any]]] | None = None
    error: str | None = None
    # with error: 400 the request was refused as given, 500 it failed inside the server
    error_status: int = 400
    # a finished beam search: the returned beams, best first, each {"output_ids",
    # "cumulative_logprob", "score", "finish_reason", "peak_pages"} (the detokenizer adds "text")
    beams: list[dict[str, Any]] | None = None


@message
class BatchTokenOut:
    outputs: list[dict[str, Any]]  # TokenOut as dicts (nested dataclasses stay plain for orjson)


@message
class SchedulerInfo:
    info: dict[str, Any]


# --- serving runtime (server / scheduler process / detokenizer), added by the serving issue ---


@message
class DetokenizeReq:
    """Scheduler process -> detokenizer, sent on the same socket before any TokenOut of rid (so it
    always arrives first): what the detokenizer needs to turn that request's ids into text."""

    rid: str
    # what shapes the text: stop, stop_regex, ...
    sampling_params: dict[str, Any] = field(default_factory=dict)


@message
class BatchTextOut:
    """Detokenizer -> tokenizer manager: TokenOut dicts, each with a "text" delta added (and
    finished_reason set once the request is done, stop strings already trimmed from the text)."""

    outputs: list[dict[str, Any]]


@message
class FlushCacheOut:
    success: bool


@message
class ProfileReq:
    """/start_profile and /stop_profile (SGLang's routes): torch.profiler around the scheduler's
    steps."""

    action: str  # "start" | "stop"
    output_dir: str | None = None
    num_steps: int | None = None  # stop by itself after this many forward steps


@message
class ProfileOut:
    success: bool
    message: str


@message
class LoraAdapterReq:
    """POST /load_lora_adapter (action "load": lora_name served from lora_path) and
    /unload_lora_adapter (action "unload")."""

    action: str
    lora_name: str
    lora_path: str | None = None


@message
class LoraAdapterOut:
    success: bool
    message: str
    adapters: list[str] = field(default_factory=list)  # loaded after the call
    param: str = "lora_name"  # the field a refusal names


@message
class HealthCheckReq:
    probe_id: int


@message
class HealthCheckOut:
    probe_id: int


@message
class ProcessReady:
    """A child process finished starting (scheduler: model loaded; info holds model_info and
    server_info)."""

    name: str
    info: dict[str, Any] = field(default_factory=dict)


@message
class ProcessFailed:
    """A child process could not start; error is the reason (a traceback's last line)."""

    name: str
    error: str


@message
class CloseSessionReq:
    session_id: str
    cache_salt: str | None = None  # a session belongs to its salt (sessions.session_key)


@message
class UnpinReq:
    handle: str
