"""A request's options besides its prompt and sampling parameters, as one frozen value.

Built once per entry point (the HTTP routes' body parsing, the Engine's generate) and carried
unchanged through the request edge's checks and n-expansion, the TokenizedGenerateReq (a msgspec
struct: the wire checks each field's type as it decodes, the edge's checks at intake its value) and
intake, to the scheduler's Req (`req.options`). Nothing downstream rebuilds or amends it (it is
frozen): a derived value (the logprob start actually served, the session's key) is a property.
"""

from __future__ import annotations

from typing import Any

import msgspec

DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's, when a request names the host and room but no port


class Bootstrap(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a disaggregated request's KV comes from or goes: the prefill server's bootstrap address
    and the room (an id both servers know the request by; sglang-router draws it)."""

    host: str
    port: int
    room: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


class RequestOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
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


def bootstrap_of(host: Any, port: Any, room: Any) -> Bootstrap | None:
    """The Bootstrap of a body's checked bootstrap_host/port/room (None without a room)."""
    if room is None:
        return None
    return Bootstrap(host or "127.0.0.1", port or DEFAULT_BOOTSTRAP_PORT, room)
