"""Intake: a tokenized request becomes a waiting Req, or a refusal that ends it alone.

The grammar a constrained request needs is compiled by a backend handed to the scheduler from
outside (GrammarBackends: constrained/choose.py's BackendChooser; core never imports it)."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.req import Req
from radixrt.runtime.core.sessions import session_key
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.edge import EdgeLimits, check_cache_salt, check_prompt
from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer
from radixrt.runtime.request.sampling_params import SamplingParams


class GrammarBackends(Protocol):
    """The grammar backends by constraint kind, built on first use."""

    def for_kind(self, kind: str) -> Any: ...

    def built(self) -> list[Any]: ...


class QueueFull(ValueError):
    """Refused for the server's state, not the request's: a 503, worth retrying later."""

    status = 503


def check_queue(num_held: int, config: Any) -> None:
    """--max-queued-requests (SGLang's): a request arriving when the requests held (running and
    waiting) fill --max-running-requests + --max-queued-requests is refused. Counted with the
    running ones so a burst that free rows will admit at the next step is not refused (every
    message waiting on the socket is taken in before a step admits any)."""
    limit = config.max_running_requests + config.max_queued_requests
    if num_held >= limit:
        raise QueueFull(
            f"the request queue is full ({num_held} requests held, the most --max-running-requests"
            " + --max-queued-requests allow); try again later"
        )


def new_req(
    msg: TokenizedGenerateReq,
    limits: EdgeLimits,
    tokenizer: Any,
    check_fault: Callable[[str, list[int]], None],
) -> Req:
    """The Req for msg, checked as the request edge checks it (ValueError: refused)."""
    sampling = SamplingParams.from_dict(msg.sampling_params)
    start = check_prompt(
        msg.input_ids,
        sampling,
        limits,
        return_logprob=msg.return_logprob,
        logprob_start_len=msg.logprob_start_len,
        top_logprobs_num=msg.top_logprobs_num,
        stream=msg.stream,
    )
    check_cache_salt(msg.cache_salt)
    check_fault("intake", msg.input_ids)
    # the output may not run past the context
    room = limits.context_len - len(msg.input_ids)
    sampling.max_new_tokens = min(sampling.max_new_tokens, room)
    req = Req(
        msg.rid,
        msg.input_ids,
        sampling,
        return_logprob=msg.return_logprob,
        logprob_start_len=start,
        top_logprobs_num=msg.top_logprobs_num,
        stream=msg.stream,
        program_id=msg.program_id,
        arrival_time=msg.arrival_time or None,
    )
    req.pin_ttl_s = msg.pin_ttl_s
    if msg.session_id is not None:  # a tenant's session is its own (sessions.session_key)
        req.session_id = session_key(msg.session_id, msg.cache_salt)
    req.lora = msg.lora_path
    if sampling.stop or sampling.stop_regex:
        req.stop_matcher = IncrementalDetokenizer.for_request(tokenizer, sampling)
    return req


def refusal(msg: TokenizedGenerateReq, error: Exception) -> TokenOut:
    """The answer to a request intake could not take: 400 when it was refused (ValueError,
    TypeError; 503 when the queue is full), 500 when intake itself failed."""
    refused = isinstance(error, (ValueError, TypeError))
    message = str(error) if refused else f"internal error: {type(error).__name__}: {error}"
    status = getattr(error, "status", 400) if refused else 500
    return TokenOut(
        rid=msg.rid,
        new_ids=[],
        finished_reason=FinishReason.abort(message).to_dict(),
        error=message,
        error_status=status,
        prompt_tokens=len(msg.input_ids) if isinstance(msg.input_ids, list) else 0,
    )
