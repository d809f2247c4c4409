"""A request's options besides its prompt and sampling parameters, as one frozen value.

Built once per entry point (the HTTP routes' body parsing, the Engine's generate) and carried
unchanged through the request edge's checks and n-expansion, the TokenizedGenerateReq (by field
name on the wire) and intake, to the scheduler's Req (`req.options`). Nothing downstream rebuilds
or amends it: a derived value (the logprob start actually served, the session's key) is a property.
"""

from __future__ import annotations

import dataclasses
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

    @property
    def logprob_start(self) -> int:
        """The first prompt position whose logprob is returned; -1: none."""
        return self.logprob_start_len if self.return_logprob else -1

    @classmethod
    def from_wire(cls, data: Any) -> RequestOptions:
        """The options a TokenizedGenerateReq carried (messages.encode writes them as a dict of
        their fields; a field of another shape is a TypeError naming it)."""
        if isinstance(data, RequestOptions):
            return data
        if not isinstance(data, dict) or set(data) - {f.name for f in dataclasses.fields(cls)}:
            raise TypeError(f"options: not a RequestOptions wire dict: {data!r:.200}")
        boot = data.get("bootstrap")
        if boot is not None:
            if not isinstance(boot, dict) or set(boot) != {"host", "port", "room"}:
                raise TypeError(f"options.bootstrap: expected host, port and room: {boot!r:.200}")
            data = {**data, "bootstrap": Bootstrap(**boot)}
        return cls(**data)


def bootstrap_of(host: Any, port: Any, room: Any) -> Bootstrap | None:
    """The Bootstrap of a body's checked bootstrap_host/port/room (None without a room)."""
    if room is None:
        return None
    return Bootstrap(host or "127.0.0.1", port or DEFAULT_BOOTSTRAP_PORT, room)
