"""The checks of a request's options (request/options.py): its cache salt, session, LoRA adapter and
prefill-decode bootstrap. Each rule's words are here once; the request edge (edge.py) runs them in
its order, the scheduler's intake runs them again on what crossed the socket.

The bootstrap has two steps: `check_bootstrap` turns a body's raw bootstrap fields into the options'
checked `Bootstrap` where the options are built (the HTTP routes), and `check_disaggregated` checks
that the request is what a prefill/decode split serves (one prompt, one sequence, no prompt
logprobs). Both run the same on the prefill and the decode server, so a request one of them refuses
is refused by the other too (neither waits for a peer that will never come).
"""

from __future__ import annotations

from typing import Any, Collection

from radixrt.runtime.request.options import (
    DEFAULT_BOOTSTRAP_PORT,
    Bootstrap,
    RequestOptions,
    bootstrap_of,
)
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.request.sampling_params import SamplingParams

# vLLM's advice is a 43-character (256-bit) random salt; the bound keeps the namespace table small
MAX_CACHE_SALT_CHARS = 256
MAX_SESSION_ID_CHARS = 128


def check_cache_salt(salt: Any) -> None:
    """cache_salt (vLLM's field): None, or the non-empty string naming the request's trust domain
    (core/namespaces.py)."""
    if salt is not None and (
        not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS
    ):
        raise RequestError(
            f"cache_salt must be a string of 1 to {MAX_CACHE_SALT_CHARS} characters",
            param="cache_salt",
        )


def check_session(session_id: Any, sp: SamplingParams, num_prompts: int) -> None:
    """A session's turn (core/sessions.py) continues one conversation: one prompt, one sequence."""
    if session_id is None:
        return
    if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_SESSION_ID_CHARS:
        raise RequestError(
            f"session_id must be a string of 1 to {MAX_SESSION_ID_CHARS} characters",
            param="session_id",
        )
    if num_prompts != 1 or sp.n != 1 or sp.is_beam:
        raise RequestError(
            "session_id needs a single prompt, n = 1 and no beam search (a session continues one "
            "conversation)",
            param="session_id",
        )


def check_lora(name: Any, loaded: Collection[str]) -> None:
    """The request's adapter (SGLang's lora_path) must be loaded; None is the base model."""
    if name is not None and (not isinstance(name, str) or name not in loaded):
        names = ", ".join(loaded) or "none"
        raise RequestError(
            f"LoRA adapter {name!r} is not loaded (loaded: {names})", param="lora_path"
        )


MAX_ROOM = 2**64 - 1


def missing_bootstrap(mode: str, field: str) -> RequestError:
    return RequestError(
        f"this is a {mode} server: {field} is required (sglang-router's PD mode adds "
        "bootstrap_host, bootstrap_port and bootstrap_room)",
        param=field,
    )


def check_bootstrap(
    mode: str, host: Any, port: Any, room: Any, *, prefill_addrs: tuple[str, ...] = ()
) -> Bootstrap | None:
    """The checked Bootstrap of a body's bootstrap_host, bootstrap_port and bootstrap_room. None in
    null mode (there SGLang's servers ignore them too), and without a room: a prefill or decode
    server refuses that request in check_disaggregated, after the prompt's own checks, as before.
    A malformed bootstrap field, though, is refused here, where the options are built: before any
    of the edge's checks (only the router may send these fields).
    prefill_addrs: on a decode server, the prefill servers it may take KV from
    (--disaggregation-prefill-addrs); the request picks one, it never names a new one."""
    if mode == "null" or room is None:
        return None
    if host is None:
        raise missing_bootstrap(mode, "bootstrap_host")
    if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
        raise RequestError(
            "bootstrap_room must be an integer in [0, 2**64)", param="bootstrap_room"
        )
    if not isinstance(host, str) or not 0 < len(host) <= 255:
        raise RequestError("bootstrap_host must be a host name", param="bootstrap_host")
    if port is not None and (
        not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
    ):
        raise RequestError("bootstrap_port must be a port number", param="bootstrap_port")
    if mode == "decode" and f"{host}:{port or DEFAULT_BOOTSTRAP_PORT}" not in prefill_addrs:
        raise RequestError(
            "bootstrap_host/bootstrap_port must name one of this decode server's prefill servers "
            "(--disaggregation-prefill-addrs)",
            param="bootstrap_host",
        )
    return bootstrap_of(host, port, room)


def check_disaggregated(
    mode: str, options: RequestOptions, sp: SamplingParams, num_prompts: int
) -> None:
    """On a prefill or decode server, the request must have a bootstrap (check_bootstrap's value:
    None for a body without a bootstrap_room, and for one without bootstrap fields, e.g.
    /pin_prefix's) and be what a prefill/decode split can serve."""
    if mode == "null":
        return
    if options.bootstrap is None:
        raise missing_bootstrap(mode, "bootstrap_room")
    if num_prompts != 1 or sp.n != 1 or sp.is_beam:
        raise RequestError(
            "a disaggregated server takes one sequence per request (one prompt, n = 1, no beam "
            "search): one bootstrap_room names one prompt's KV",
            param="n" if sp.n != 1 else "bootstrap_room",
        )
    if options.logprob_start >= 0:  # -1 unless prompt logprobs were asked for
        raise RequestError(
            "prompt logprobs (logprob_start_len) are not served with disaggregation: the decode "
            "server never computes the prompt",
            param="logprob_start_len",
        )
