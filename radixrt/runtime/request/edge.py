"""The request edge: every check of a request, in one fixed order, then its n-expansion.

`admit` is the one way in. Its order: the sampling parameters and stop rules
(SamplingParams.from_dict), the stop regexes and the constraint (through the caller's validator:
the Engine waits on its compile workers, the tokenizer manager runs the whole edge on a worker
thread when something must compile), then for each prompt the prompt itself (prompt_checks.py),
its LoRA adapter, session, cache salt and prefill-decode split (option_checks.py), then the
expansion into scheduler requests, pure. The Engine and the tokenizer manager (for every HTTP
route) call `admit`; the scheduler's intake runs `check_request` (the same checks, no expansion) on
what crossed the socket. A refusal is a RequestError naming the field (an HTTP 400, the Engine's
ValueError, an abort of that request alone at intake). No torch, no HTTP framework here.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol

from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.option_checks import (
    check_cache_salt,
    check_disaggregated,
    check_lora,
    check_session,
)
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.prompt_checks import EdgeLimits, LogprobBudget, check_prompt
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.request.sampling_param_names import CONSTRAINT_FIELDS
from radixrt.runtime.request.sampling_params import SamplingParams

__all__ = [
    "EdgeRules",
    "Validator",
    "admit",
    "check_request",
    "check_sampling",
    "constraint_of",
    "expand_n",
    "needs_compile",
    "per_prompt",
    "rows_of",
]

CONSTRAINT_KINDS = CONSTRAINT_FIELDS  # a constraint's kind is the name of its sampling parameter
STOP_REGEX = "stop_regex"  # the validator's kind for a request's stop regexes


class Validator(Protocol):
    """Checks that a request's stop regexes (kind "stop_regex", the patterns) or its constraint
    (kind, spec) compile; ValueError saying why not."""

    def __call__(self, kind: str, spec: Any) -> None: ...


@dataclass(frozen=True)
class EdgeRules:
    """What this server allows a request: the model's and the pool's limits, the LoRA adapters
    loaded now, and its part in a prefill-decode split (--disaggregation-mode)."""

    limits: EdgeLimits
    loras: Collection[str] = ()
    disaggregation_mode: str = "null"


def admit(
    prompts: list[list[int]],
    params: list[Any],
    options: list[RequestOptions],
    rules: EdgeRules,
    *,
    new_rid: Callable[[], str],
    validate: Validator,
) -> list[list[TokenizedGenerateReq]]:
    """A request body's prompts, each checked with its sampling dict and options (one per prompt;
    a dict given for several prompts is checked once), then each expanded into its scheduler
    requests (the list per prompt). The logprob volume counts the body's prompts together."""
    if not len(prompts) == len(params) == len(options):  # the callers' per_prompt makes them so
        raise RequestError(
            f"{len(prompts)} prompts with {len(params)} sampling dicts and {len(options)} options",
            param="prompt",
        )
    checked: dict[int, SamplingParams] = {}
    for p in params:
        if id(p) not in checked:
            checked[id(p)] = check_sampling(p, validate)
    sps = [checked[id(p)] for p in params]
    budget = LogprobBudget()
    for ids, sp, opts in zip(prompts, sps, options):
        check_request(ids, sp, opts, rules, num_prompts=len(prompts), budget=budget)
    return [expand_n(new_rid(), ids, sp, opts) for ids, sp, opts in zip(prompts, sps, options)]


def check_sampling(params: Any, validate: Validator) -> SamplingParams:
    """The sampling parameters and stop rules, then the stop regexes and the constraint through
    validate (SamplingParams' words name the parameter: the RequestError's param)."""
    try:
        sp = SamplingParams.from_dict(params)
    except (TypeError, ValueError) as e:  # TypeError: not a dict
        named = re.search(r"sampling parameters? (\w+)", str(e))
        raise RequestError(str(e), param=named.group(1) if named else None) from None
    if sp.stop_regex:
        _validated(validate, STOP_REGEX, sp.stop_regex)
    constraint = constraint_of(sp)
    if constraint is not None:
        _validated(validate, *constraint)
    return sp


def _validated(validate: Validator, kind: str, spec: Any) -> None:
    try:
        validate(kind, spec)
    except RequestError:
        raise
    except ValueError as e:
        message = str(e) if kind == STOP_REGEX else f"invalid {kind}: {e}"
        raise RequestError(message, param=kind) from None


def check_request(
    input_ids: Any,
    sp: SamplingParams,
    options: RequestOptions,
    rules: EdgeRules,
    *,
    num_prompts: int = 1,
    budget: LogprobBudget | None = None,
) -> None:
    """One prompt with its checked sampling parameters and options: can it ever run here.
    num_prompts: the body's (a session or a disaggregated server takes one); budget: the logprob
    items of the body's earlier prompts (None: this prompt alone)."""
    check_prompt(input_ids, sp, rules.limits, options, budget)
    check_lora(options.lora, rules.loras)
    check_session(options.session_id, sp, num_prompts)
    check_cache_salt(options.cache_salt)
    check_disaggregated(rules.disaggregation_mode, options, sp, num_prompts)


def needs_compile(params: Any) -> bool:
    """Whether a raw sampling dict names a stop regex or a constraint: checking it compiles
    something (the tokenizer manager then runs the edge off its event loop)."""
    return isinstance(params, dict) and any(
        params.get(k) is not None for k in (STOP_REGEX, *CONSTRAINT_FIELDS)
    )


def per_prompt(value: Any, num_prompts: int, name: str) -> list[Any]:
    """A parameter given once for every prompt or as a list with one per prompt (SGLang's batch
    shape): one per prompt, or RequestError naming it."""
    if not isinstance(value, list):
        return [value] * num_prompts
    if len(value) != num_prompts:
        raise RequestError(f"{name} has {len(value)} entries for {num_prompts} prompts", param=name)
    return value


def constraint_of(sp: SamplingParams) -> tuple[str, Any] | None:
    """(kind, spec) of the request's constraint, or None (at most one is set: validated)."""
    for kind in CONSTRAINT_KINDS:
        spec = getattr(sp, kind)
        if spec is not None:
            if kind == "structural_tag":  # served as the grammar it stands for
                from radixrt.runtime.request.structural_tag import structural_tag_grammar

                return "ebnf", structural_tag_grammar(spec)
            return kind, spec
    return None


def rows_of(sampling: dict) -> int:
    """The sequences one prompt's raw sampling dict asks for (n, or a beam search's width), read
    before the dict is checked: a value that is not an int above 1 counts 1 (its check refuses
    it)."""
    asked = [sampling.get("n"), sampling.get("beam_width")]
    return max((v for v in asked if type(v) is int and v > 1), default=1)


def expand_n(
    base_rid: str, input_ids: list[int], sp: SamplingParams, options: RequestOptions
) -> list[TokenizedGenerateReq]:
    """One checked prompt -> sp.n scheduler requests: rid base (n = 1) or base-0..base-{n-1}, seeds
    seed+i, each with the same options. A beam search is one request whatever n (its n is the
    beams it returns)."""
    copies = 1 if sp.is_beam else sp.n
    reqs = []
    for i in range(copies):
        seed = None if sp.seed is None else sp.seed + i
        params = sp if sp.is_beam else dataclasses.replace(sp, n=1, seed=seed)
        reqs.append(
            TokenizedGenerateReq(
                rid=base_rid if copies == 1 else f"{base_rid}-{i}",
                input_ids=list(input_ids),
                sampling_params=params.to_dict(),
                options=options,
                arrival_time=time.time(),
            )
        )
    return reqs
