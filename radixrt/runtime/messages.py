"""Every message that crosses a process boundary (HTTP process <-> scheduler <-> detokenizer),
declared once as a msgspec struct and sent as MessagePack (never pickle).

Each message is a `Message`: msgspec tags it with its class name, and `decode` reads any of them
through one decoder that checks every field's type as it reads (an unknown tag or field, a field of
another type: a ValueError naming it). A generate request that fails so is a `MalformedRequest`
carrying its rid, so the scheduler can still answer it (a 400 naming the field).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from radixrt.runtime.request.options import RequestOptions


class Message(msgspec.Struct, tag=True, kw_only=True, forbid_unknown_fields=True):
    """A message between radixrt's processes; its class name is its tag on the wire."""


class MalformedRequest(ValueError):
    """A TokenizedGenerateReq whose fields are not of their types: answered for its rid."""

    def __init__(self, rid: str, error: str):
        super().__init__(error)
        self.rid = rid


class TokenizedGenerateReq(Message):
    """One sequence to generate (n>1 is expanded into n of these before the scheduler)."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams.to_dict(), already validated
    # stream, logprobs, program/session/pin, LoRA, cache salt, bootstrap: built once at the entry
    options: RequestOptions = msgspec.field(default_factory=RequestOptions)
    arrival_time: float = 0.0


class AbortReq(Message):
    rid: str


class FlushCacheReq(Message):
    pass


class GetServerInfoReq(Message):
    pass


class GetCacheTreeReq(Message):
    max_depth: int
    max_nodes: int


class CacheTreeOut(Message):
    view: dict[str, Any]  # core/cache_view.py's view (token ids), or {"error": ...}


class TokenOut(Message):
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
    output_logprobs: list[list[Any]] = msgspec.field(default_factory=list)
    output_top_logprobs: list[list[list[Any]]] = msgspec.field(default_factory=list)
    # prompt logprobs, sent once with the first delta when requested
    input_logprobs: list[list[Any]] | None = None
    input_top_logprobs: list[list[list[Any]]] | None = None
    error: str | None = None
    # with error: 400 the request was refused as given, 500 it failed inside the server
    error_status: int = 400
    # a finished beam search: the returned beams, best first, each {"output_ids",
    # "cumulative_logprob", "score", "finish_reason", "peak_pages"} (the detokenizer adds "text")
    beams: list[dict[str, Any]] | None = None


class TextOut(TokenOut):
    """A TokenOut with its text: the detokenizer's answer for one request in one step."""

    text: str = ""  # the delta's text (stop strings already trimmed)
    # the detokenizer failed the request while the scheduler still runs it: the HTTP process
    # aborts it there
    abort_scheduler: bool = False


class BatchTokenOut(Message):
    outputs: list[TokenOut]


class SchedulerInfo(Message):
    info: dict[str, Any]


# --- serving runtime (server / scheduler process / detokenizer), added by the serving issue ---


class DetokenizeReq(Message):
    """Scheduler process -> detokenizer, sent on the same socket before any TokenOut of rid (so it
    always arrives first): what the detokenizer needs to turn that request's ids into text."""

    rid: str
    # what shapes the text: stop, stop_regex, ...
    sampling_params: dict[str, Any] = msgspec.field(default_factory=dict)


class BatchTextOut(Message):
    """Detokenizer -> tokenizer manager: each TokenOut with its text (and finished_reason set once
    the request is done)."""

    outputs: list[TextOut]


class FlushCacheOut(Message):
    success: bool


class ProfileReq(Message):
    """/start_profile and /stop_profile (SGLang's routes): torch.profiler around the scheduler's
    steps."""

    action: str  # "start" | "stop"
    output_dir: str | None = None
    num_steps: int | None = None  # stop by itself after this many forward steps


class ProfileOut(Message):
    success: bool
    message: str


class LoraAdapterReq(Message):
    """POST /load_lora_adapter (action "load": lora_name served from lora_path) and
    /unload_lora_adapter (action "unload")."""

    action: str
    lora_name: str
    lora_path: str | None = None


class LoraAdapterOut(Message):
    success: bool
    message: str
    adapters: list[str] = msgspec.field(default_factory=list)  # loaded after the call
    param: str = "lora_name"  # the field a refusal names


class HealthCheckReq(Message):
    probe_id: int


class HealthCheckOut(Message):
    probe_id: int


class ProcessReady(Message):
    """A child process finished starting (scheduler: model loaded; info holds model_info and
    server_info)."""

    name: str
    info: dict[str, Any] = msgspec.field(default_factory=dict)


class ProcessFailed(Message):
    """A child process could not start; error is the reason (a traceback's last line)."""

    name: str
    error: str


class CloseSessionReq(Message):
    session_id: str
    cache_salt: str | None = None  # a session belongs to its salt (sessions.session_key)


class UnpinReq(Message):
    handle: str


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


_MESSAGES = Union[tuple(_subclasses(Message))]  # every message above (TextOut included)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_MESSAGES)


class _RequestId(msgspec.Struct, tag="TokenizedGenerateReq"):
    """What a malformed TokenizedGenerateReq is still read for: whom to answer."""

    rid: str


_rid_decoder = msgspec.msgpack.Decoder(_RequestId)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """The message data holds, every field checked against its type (ValueError naming the field;
    MalformedRequest for a generate request whose rid can still be answered)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as e:  # ValidationError included
        try:
            rid = _rid_decoder.decode(data).rid
        except msgspec.DecodeError:
            raise ValueError(f"a malformed message: {e}") from None
        raise MalformedRequest(rid, f"a malformed request: {e}") from None


def output_dicts(batch: BatchTextOut) -> list[dict[str, Any]]:
    """The HTTP process's view of a batch: one dict per request (its queues and routes read
    those)."""
    return [msgspec.structs.asdict(out) for out in batch.outputs]
