"""The request edge's checks for a disaggregated server: a request names its prefill server's
bootstrap address and a room, and asks for what a prefill/decode split can serve. The same checks
run on both servers, so a request one of them refuses is refused by the other too (neither waits
for a peer that will never come)."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.core.scheduler_pd import DEFAULT_BOOTSTRAP_PORT
from radixrt.runtime.request.edge import RequestError

MAX_ROOM = 2**64 - 1


def check_bootstrap(
    mode: str,
    host: Any,
    port: Any,
    room: Any,
    *,
    num_prompts: int,
    n: int,
    is_beam: bool,
    logprob_start_len: int | None,
    prefill_addrs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The TokenizedGenerateReq fields of a request's bootstrap ({} in null mode: there SGLang's
    servers ignore them too). prefill_addrs: on a decode server, the prefill servers it may take
    KV from (--disaggregation-prefill-addrs); the request picks one, it never names a new one."""
    if mode == "null":
        return {}
    if room is None or host is None:
        missing = "bootstrap_room" if room is None else "bootstrap_host"
        raise RequestError(
            f"this is a {mode} server: {missing} is required (sglang-router's PD mode adds "
            "bootstrap_host, bootstrap_port and bootstrap_room)",
            param=missing,
        )
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
    return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
