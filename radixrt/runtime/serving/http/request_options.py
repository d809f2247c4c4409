"""A request's RequestOptions (request/options.py) from the HTTP body's fields, built once by the
route that parsed the body and carried unchanged through the request edge (TokenizerManager.admit).

The body's bootstrap fields are checked here (request/option_checks.check_bootstrap) as they become
the options' Bootstrap: a room needs a host, each must be well formed, and a decode server takes KV
only from its own prefill servers. Whether the request suits a split at all (a room on a prefill or
decode server, one sequence, no prompt logprobs) is the edge's check, after the prompt's own.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.request.option_checks import check_bootstrap
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.serving.http.protocol import from_value_error


def request_options(
    config: Any,
    bootstrap: tuple[Any, Any, Any] = (None, None, None),
    *,
    logprob_start_len: int | None = None,
    **fields: Any,
) -> RequestOptions:
    """The options of a body: bootstrap is its (bootstrap_host, bootstrap_port, bootstrap_room)
    (GenerateRequest.bootstrap()), checked for this server's --disaggregation-mode (a 4xx naming
    the field); logprob_start_len None is -1 (no prompt logprobs); fields: RequestOptions' others
    (stream, return_logprob, top_logprobs_num, program_id, pin_ttl_s, session_id, lora,
    cache_salt, priority, client), as the body gave them (the edge checks them)."""
    try:
        boot = check_bootstrap(
            config.disaggregation_mode, *bootstrap, prefill_addrs=config.prefill_bootstrap_addrs
        )
    except RequestError as e:
        raise from_value_error(e) from None
    start = -1 if logprob_start_len is None else logprob_start_len
    return RequestOptions(logprob_start_len=start, bootstrap=boot, **fields)
