"""Intake: a tokenized request becomes a waiting Req, or a refusal that ends it alone.

The grammar a constrained request needs is compiled by a backend handed to the scheduler from
outside (GrammarBackends: constrained/choose.py's BackendChooser; core never imports it)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, Callable, Protocol

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.finish_reason import FinishReason
from radixrt.runtime.core.req import GrammarState, Req, ReqStatus
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.edge import EdgeRules, check_request
from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer
from radixrt.runtime.request.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class GrammarBackend(Protocol):
    """One grammar backend (constrained/backend.py): compiles a constraint off the loop."""

    def request(self, kind: str, spec: Any) -> Future[GrammarState]: ...

    def validate(self, kind: str, spec: Any) -> None: ...  # ValueError: it would not compile

    def shutdown(self) -> None: ...


class GrammarBackends(Protocol):
    """The grammar backends by constraint kind, built on first use."""

    def for_kind(self, kind: str) -> GrammarBackend: ...

    def built(self) -> list[GrammarBackend]: ...

    # the state of `future` wrapped so the grammar starts after these tokens (a model's thinking)
    def after_reasoning(self, future: Any, end_ids: tuple[int, ...]) -> Any: ...


class QueueFull(ValueError):
    """Refused for the server's state, not the request's: a 503, worth retrying later."""

    status = 503


def check_queue(num_held: int, config: ServerConfig) -> None:
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
    rules: EdgeRules,
    tokenizer: Any,
    check_fault: Callable[[str, list[int]], None],
) -> Req:
    """The Req for msg, checked as the request edge checks it (request/edge.check_request; a
    ValueError or TypeError: refused)."""
    sampling = SamplingParams.from_dict(msg.sampling_params)
    options = msg.options  # its fields' types checked as the message was decoded (messages.py)
    check_request(msg.input_ids, sampling, options, rules)
    check_fault("intake", msg.input_ids)
    # the output may not run past the context
    room = rules.limits.context_len - len(msg.input_ids)
    sampling.max_new_tokens = min(sampling.max_new_tokens, room)
    req = Req(msg.rid, msg.input_ids, sampling, options, arrival_time=msg.arrival_time or None)
    if sampling.stop or sampling.stop_regex:
        req.stop_matcher = IncrementalDetokenizer.for_request(tokenizer, sampling)
    return req


def refusal(rid: str, prompt_tokens: int, error: Exception) -> TokenOut:
    """The answer to a request intake could not take: 400 when it was refused (ValueError,
    TypeError; 503 when the queue is full), 500 when intake itself failed."""
    refused = isinstance(error, (ValueError, TypeError))
    message = str(error) if refused else f"internal error: {type(error).__name__}: {error}"
    status = getattr(error, "status", 400) if refused else 500
    return TokenOut(
        rid=rid,
        new_ids=[],
        finished_reason=FinishReason.abort(message).to_dict(),
        error=message,
        error_status=status,
        prompt_tokens=prompt_tokens,
    )


def collect_grammars(
    waiting: list[Req], check_fault: Callable[[str, list[int]], None]
) -> list[tuple[Req, str, int, str]]:
    """Waiting requests whose grammar compile finished get it (then they can be admitted), or leave
    waiting to fail alone: (request, error, status, finish reason) with 400 when the grammar was
    refused (a ValueError), 500 for anything else."""
    failed = []
    for req in [r for r in waiting if r.status is ReqStatus.WAITING_FOR_GRAMMAR]:
        fut = req.grammar_future
        if not fut.done():
            continue
        req.grammar_future = None
        try:
            check_fault("grammar", req.origin_input_ids)
            req.grammar = fut.result()
            req.move_to(ReqStatus.WAITING)
        except Exception as e:
            waiting.remove(req)
            if isinstance(e, ValueError):
                failed.append((req, str(e), 400, f"invalid constraint: {e}"))
            else:
                log.exception("collecting the grammar of %s failed", req.rid)
                error = f"internal error: {type(e).__name__}: {e}"
                failed.append((req, error, 500, error))
    return failed
