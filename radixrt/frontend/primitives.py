"""The DSL's primitives: the expressions a program appends to its state `s`.

gen (and gen_int / gen_string) generates into a variable, select picks one of given choices, and
system / user / assistant (or their _begin / _end halves) mark the chat roles around them.
"""

from __future__ import annotations

import re
from typing import Any

from radixrt.frontend import ir
from radixrt.frontend.choices import token_length_normalized

# gen(n=...): samples of one gen (each one request sharing the prompt's pages)
MAX_GEN_SAMPLES = 64


def _gen_select(
    name: str | None, choices: list[str], temperature: float | None, choices_method: Any
) -> ir.Expr:
    """gen(choices=...): a select, greedy unless the gen sets a temperature."""
    return ir.Select(
        name,
        choices,
        0.0 if temperature is None else temperature,
        choices_method or token_length_normalized,
    )


def _check_gen_arguments(n: int | None, regex: str | None, json_schema: Any, dtype: Any) -> None:
    """Refuse, at the program's line, a bad sample count, a regex Python cannot compile, or more
    than one of regex, json_schema and dtype."""
    if n is not None and (
        isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_GEN_SAMPLES
    ):
        raise ValueError(f"gen n must be an int in [1, {MAX_GEN_SAMPLES}], got {n!r}")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"gen regex {regex!r} is invalid: {e}") from None
    constraints = [
        k
        for k, v in (("regex", regex), ("json_schema", json_schema), ("dtype", dtype))
        if v is not None
    ]
    if len(constraints) > 1:
        raise ValueError(
            f"gen takes one of regex, json_schema and dtype, got {' and '.join(constraints)}"
        )


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    choices: list[str] | None = None,
    dtype: Any = None,
    choices_method: Any = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    n: int | None = None,
    stop_regex: str | list[str] | None = None,
    lora_path: str | None = None,
) -> ir.Expr:
    """Generate text into variable `name`. With `choices`, this is select(name, choices)."""
    if choices:
        return _gen_select(name, choices, temperature, choices_method)
    _check_gen_arguments(n, regex, json_schema, dtype)
    params = ir.GenParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        stop_regex=stop_regex,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        n=n,
        regex=regex,
        json_schema=ir.json_schema_string(json_schema),
        dtype=dtype,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        lora_path=lora_path,
    )
    if dtype is not None:
        params.resolve(ir.GenParams())  # reject a bad dtype here, at the program's line
    return ir.Gen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> ir.Expr:
    return gen(name, max_tokens=max_tokens, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, **kwargs: Any) -> ir.Expr:
    return gen(name, max_tokens=max_tokens, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: Any = token_length_normalized,
) -> ir.Expr:
    if choices is None:
        raise ValueError("select needs choices")
    return ir.Select(name, choices, temperature, choices_method)


def _role(role: str, expr: Any = None) -> ir.Expr:
    if expr is None:
        return ir.ExprList([ir.RoleBegin(role), ir.RoleEnd(role)])
    return ir.ExprList([ir.RoleBegin(role), ir.as_expr(expr), ir.RoleEnd(role)])


def system(expr: Any = None) -> ir.Expr:
    return _role("system", expr)


def user(expr: Any = None) -> ir.Expr:
    return _role("user", expr)


def assistant(expr: Any = None) -> ir.Expr:
    return _role("assistant", expr)


def system_begin() -> ir.Expr:
    return ir.RoleBegin("system")


def system_end() -> ir.Expr:
    return ir.RoleEnd("system")


def user_begin() -> ir.Expr:
    return ir.RoleBegin("user")


def user_end() -> ir.Expr:
    return ir.RoleEnd("user")


def assistant_begin() -> ir.Expr:
    return ir.RoleBegin("assistant")


def assistant_end() -> ir.Expr:
    return ir.RoleEnd("assistant")
