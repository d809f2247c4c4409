"""The prompt's checks: can it ever run on this model and pool with these sampling parameters and
options (token ids, context, KV, a beam search's room, the logprob volume, a reasoning end tag)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.request.sampling_params import MAX_TOP_LOGPROBS, SamplingParams

MAX_REASONING_END_IDS = 16  # an end-of-thinking tag is one token on the models that have one
# The logprob items (a position's token plus each of its top alternatives) one request may ask for,
# every prompt and copy together: each is decoded and encoded on the serving event loop (#56: a
# 30k-token prompt's logprobs from position 0 with 20 alternatives were ~650k decodes and stalled
# /health). 2^17 is a 32k-token prompt's logprobs with 3 alternatives, or 6,000 positions with 20.
MAX_LOGPROB_ITEMS = 1 << 17


@dataclass(frozen=True)
class EdgeLimits:
    """What the model and the pool allow a single request."""

    vocab_size: int
    context_len: int
    pool_tokens: int
    max_running: int = 2**31 - 1  # requests running at once (a beam search runs beam_width)
    page_size: int = 1


class LogprobBudget:
    """The logprob items of one request's prompts so far (positions x (1 + top alternatives), every
    copy), refused past MAX_LOGPROB_ITEMS before anything runs."""

    def __init__(self, limit: int = MAX_LOGPROB_ITEMS):
        self.limit, self.used = limit, 0

    def take(self, num_prompt_tokens: int, sp: SamplingParams, options: RequestOptions) -> None:
        top = options.top_logprobs_num
        if not (options.return_logprob or top > 0):
            return
        start = options.logprob_start  # -1: no prompt logprobs
        prompt = num_prompt_tokens - start if start >= 0 else 0
        positions = prompt + max(sp.max_new_tokens, 0)
        self.used += positions * (1 + top) * (1 if sp.is_beam else sp.n)
        if self.used > self.limit:
            raise RequestError(
                f"the request asks for {self.used} logprob items (positions from "
                f"logprob_start_len and max_new_tokens, times 1 + top_logprobs_num, times n), "
                f"over the {self.limit} allowed",
                param="logprob_start_len" if prompt else "top_logprobs_num",
            )


def check_prompt(
    input_ids: Any,
    sp: SamplingParams,
    limits: EdgeLimits,
    options: RequestOptions,
    budget: LogprobBudget | None = None,
) -> None:
    """RequestError unless the prompt can run with these sampling parameters and options; budget:
    the logprob items of the request's earlier prompts (None: this prompt alone)."""
    if not isinstance(input_ids, list) or not input_ids:
        raise RequestError("the prompt is empty", param="prompt")
    n = len(input_ids)
    vocab = limits.vocab_size
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in input_ids):
        raise RequestError(f"input_ids must be token ids in [0, {vocab})", param="input_ids")
    if n >= limits.context_len:
        raise RequestError(
            f"the prompt has {n} tokens but this model's context length is {limits.context_len}",
            param="prompt",
            code="context_length_exceeded",
        )
    if sp.max_new_tokens > limits.context_len:
        raise RequestError(
            f"max_new_tokens is {sp.max_new_tokens} but this model's context length is "
            f"{limits.context_len}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    _check_token_ids(sp, vocab)
    need = n + min(sp.max_new_tokens, limits.context_len - n)  # the scheduler clamps at the context
    if need > limits.pool_tokens:
        raise RequestError(
            f"the request needs {need} tokens of KV (prompt {n} + max_new_tokens) but the KV pool "
            f"holds {limits.pool_tokens}; it can never run",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if sp.is_beam:
        check_beam_request(
            n, sp, limits, stream=options.stream, return_logprob=options.return_logprob
        )
    _check_logprobs(n, sp, options, budget)
    ends = options.reasoning_end_ids
    if ends is not None and not (
        1 <= len(ends) <= MAX_REASONING_END_IDS and all(0 <= t < vocab for t in ends)
    ):
        raise RequestError(
            f"reasoning_end_ids must be 1 to {MAX_REASONING_END_IDS} token ids in [0, {vocab})",
            param="reasoning_end_ids",
        )


def _check_logprobs(
    n: int, sp: SamplingParams, options: RequestOptions, budget: LogprobBudget | None
) -> None:
    """logprob_start_len and top_logprobs_num in range, and their items within the budget."""
    start = options.logprob_start
    if not (isinstance(start, int) and -1 <= start < n):
        raise RequestError(
            f"logprob_start_len must be in [-1, {n - 1}], got {start}", param="logprob_start_len"
        )
    top = options.top_logprobs_num
    if not (isinstance(top, int) and 0 <= top <= MAX_TOP_LOGPROBS):
        raise RequestError(
            f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top}",
            param="top_logprobs",
        )
    (budget or LogprobBudget()).take(n, sp, options)


def _check_token_ids(sp: SamplingParams, vocab: int) -> None:
    """logit_bias keys and stop_token_ids are ids of this vocabulary."""
    bad_bias = [t for t, _ in sp.logit_bias_pairs() if t >= vocab]
    if bad_bias:
        raise RequestError(
            f"logit_bias keys must be token ids in [0, {vocab}), got {bad_bias[:3]}",
            param="logit_bias",
        )
    bad_stop = [t for t in sp.stop_token_ids if t >= vocab]
    if bad_stop:
        raise RequestError(
            f"stop_token_ids must be token ids in [0, {vocab}), got {bad_stop[:3]}",
            param="stop_token_ids",
        )


def check_beam_request(
    prompt_len: int, sp: SamplingParams, limits: EdgeLimits, *, stream: bool, return_logprob: bool
) -> None:
    """A beam search (beam_width > 1) is answered whole, with each beam's cumulative logprob, and
    must fit the batch and the pool even if its beams shared nothing after the prompt."""
    if stream:
        raise RequestError(
            "beam search (beam_width > 1) cannot stream: its beams are known only at the end",
            param="stream",
        )
    if return_logprob:
        raise RequestError(
            "beam search (beam_width > 1) returns each beam's cumulative_logprob, not per-token "
            "logprobs: leave return_logprob off",
            param="return_logprob",
        )
    width = sp.beam_width
    if width > limits.max_running:
        raise RequestError(
            f"beam_width {width} exceeds the {limits.max_running} requests this server runs at "
            "once (--max-running-requests)",
            param="beam_width",
        )
    new = min(sp.max_new_tokens, limits.context_len - prompt_len)
    need = prompt_len + width * (new + limits.page_size)
    if need > limits.pool_tokens:
        raise RequestError(
            f"a beam search (beam_width {width}) may need {need} tokens of KV (prompt "
            f"{prompt_len} + {width} beams x (max_new_tokens + a page)) but the KV pool holds "
            f"{limits.pool_tokens}; it can never run",
            param="beam_width",
        )
