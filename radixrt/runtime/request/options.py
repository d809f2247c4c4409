"""A request's options besides its prompt and sampling parameters, as one frozen value.

Built once per entry point (the HTTP routes' body parsing, the Engine's generate) and carried
unchanged through the request edge's checks and n-expansion, the TokenizedGenerateReq (by field
name on the wire) and intake, to the scheduler's Req (`req.options`). Nothing downstream rebuilds
or amends it: a derived value (the logprob start actually served, the session's key) is a property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's, when a request names the host and room but no port


@dataclass(frozen=True)
class Bootstrap:
    """Where a disaggregated request's KV comes from or goes: the prefill server's bootstrap address
    and the room (an id both servers know the request by; sglang-router draws it)."""

    host: str
    port: int
    room: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class RequestOptions:
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs; k: of prompt tokens k..end
    top_logprobs_num: int = 0
    program_id: str | None = None  # the DSL program the request belongs to (a cache hint)
    pin_ttl_s: float | None = None  # keep the prompt pinned in the tree after it finishes
    session_id: str | None = None  # a turn of this session, pinned until the next (sessions.py)
    lora: str | None = None  # the LoRA adapter's name (SGLang's field lora_path); None: base
    cache_salt: str | None = None  # vLLM's: KV is shared only within one salt (namespaces.py)
    bootstrap: Bootstrap | None = None  # prefill-decode disaggregation (None: not disaggregated)
    # a reasoning model's end-of-thinking tag as token ids: the request's grammar starts after them
    # (constrained/reasoning_gate.py); set by the OpenAI routes under --reasoning-parser
    reasoning_end_ids: tuple[int, ...] | None = None
    # whom the request counts against (serving/tenants.client_of: a digest, never a key), set by
    # the route that built the options: admission takes turns across clients
    # (schedule_policy.order_waiting), the tokenizer manager holds it to its share
    client: str | None = None
    priority: int | None = None  # SGLang's: under --enable-priority-scheduling, admitted first

    @property
    def logprob_start(self) -> int:
        """The first prompt position whose logprob is returned; -1: none."""
        return self.logprob_start_len if self.return_logprob else -1

    @classmethod
    def from_wire(cls, data: Any) -> RequestOptions:
        """The options a TokenizedGenerateReq carried (messages.encode writes them as a dict of
        their fields). Each field's type is checked here, its value by the edge's checks at intake;
        a field of another shape is a TypeError naming it."""
        if isinstance(data, RequestOptions):
            return data
        if not isinstance(data, dict) or set(data) - set(WIRE_TYPES):
            raise TypeError(f"options: not a RequestOptions wire dict: {data!r:.200}")
        for name, value in data.items():
            if not _is(value, WIRE_TYPES[name]):
                raise TypeError(f"options.{name}: {value!r:.100} is not {WIRE_TYPES[name]}")
        boot = data.get("bootstrap")
        if boot is not None:
            if set(boot) != {"host", "port", "room"} or not (
                _is(boot["host"], "str") and _is(boot["port"], "int") and _is(boot["room"], "int")
            ):
                raise TypeError(f"options.bootstrap: expected host, port and room: {boot!r:.200}")
            data = {**data, "bootstrap": Bootstrap(**boot)}
        ends = data.get("reasoning_end_ids")
        if ends is not None:
            if not all(_is(t, "int") for t in ends):
                raise TypeError(f"options.reasoning_end_ids: not token ids: {ends!r:.100}")
            data = {**data, "reasoning_end_ids": tuple(ends)}
        return cls(**data)


# each wire field's type, as `_is` reads it
WIRE_TYPES = {
    "stream": "bool",
    "return_logprob": "bool",
    "logprob_start_len": "int",
    "top_logprobs_num": "int",
    "program_id": "str or None",
    "pin_ttl_s": "number or None",
    "session_id": "str or None",
    "lora": "str or None",
    "cache_salt": "str or None",
    "bootstrap": "dict or None",
    "reasoning_end_ids": "list or None",
    "client": "str or None",
    "priority": "int or None",
}


def _is(value: Any, kind: str) -> bool:
    if value is None:
        return kind.endswith("or None")
    base = kind.split()[0]
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "dict": dict, "list": (list, tuple)}[base])


def bootstrap_of(host: Any, port: Any, room: Any) -> Bootstrap | None:
    """The Bootstrap of a body's checked bootstrap_host/port/room (None without a room)."""
    if room is None:
        return None
    return Bootstrap(host or "127.0.0.1", port or DEFAULT_BOOTSTRAP_PORT, room)
