"""The request edge's checks for a disaggregated server: a request names its prefill server's
bootstrap address and a room, and asks for what a prefill/decode split can serve. The same checks
run on both servers, so a request one of them refuses is refused by the other too (neither waits
for a peer that will never come).

Two steps: `check_bootstrap` turns the body's raw bootstrap fields into the request's checked
`Bootstrap` where its options are built (the HTTP routes), and `check_disaggregated` checks the
request those options go with (one prompt, one sequence, no prompt logprobs) at the tokenizer
manager's `make_requests`."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.request.edge import RequestError
from radixrt.runtime.request.options import DEFAULT_BOOTSTRAP_PORT, Bootstrap, bootstrap_of

MAX_ROOM = 2**64 - 1


def _missing(mode: str, field: str) -> RequestError:
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
    A malformed bootstrap field, though, is refused here, where the options are built: before the
    prompt's and the LoRA adapter's checks (only the router may send these fields).
    prefill_addrs: on a decode server, the prefill servers it may take KV from
    (--disaggregation-prefill-addrs); the request picks one, it never names a new one."""
    if mode == "null" or room is None:
        return None
    if host is None:
        raise _missing(mode, "bootstrap_host")
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
    mode: str,
    bootstrap: Bootstrap | None,
    *,
    num_prompts: int,
    n: int,
    is_beam: bool,
    logprob_start_len: int | None,
) -> None:
    """On a prefill or decode server, RequestError unless the request has a bootstrap (its options'
    check_bootstrap value: None for a body without a bootstrap_room, and for a request whose body
    has no bootstrap fields, e.g. /pin_prefix's) and is what a prefill/decode split can serve.
    logprob_start_len: the logprob start served (RequestOptions.logprob_start: -1 unless prompt
    logprobs were asked for)."""
    if mode == "null":
        return
    if bootstrap is None:
        raise _missing(mode, "bootstrap_room")
    if num_prompts != 1 or n != 1 or is_beam:
        raise RequestError(
            "a disaggregated server takes one sequence per request (one prompt, n = 1, no beam "
            "search): one bootstrap_room names one prompt's KV",
            param="n" if n != 1 else "bootstrap_room",
        )
    if logprob_start_len is not None and logprob_start_len >= 0:
        raise RequestError(
            "prompt logprobs (logprob_start_len) are not served with disaggregation: the decode "
            "server never computes the prompt",
            param="logprob_start_len",
        )
