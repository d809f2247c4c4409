"""The program's intermediate representation: what `s += ...` appends.

Nodes are plain objects; `a + b` builds an ExprList so `s += "Q: " + gen("x")` works
as in SGLang. Every node that produces a variable has a `name`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# Typed generation (gen(dtype=...), gen_int, gen_string) compiles to a regex. The
# trailing whitespace plus the " "/"\n" stop strings let the model end the number
# naturally; the stop string is trimmed from the value (SGLang behaves the same).
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_REGEX = {
    "int": (REGEX_INT, [" ", "\n"]),
    "float": (REGEX_FLOAT, [" ", "\n"]),
    "bool": (REGEX_BOOL, []),
    "str": (REGEX_STR, []),
}

# gen() argument name -> runtime sampling-parameter name
_SAMPLING_NAMES = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "regex": "regex",
    "json_schema": "json_schema",
    "n": "n",
    "stop_regex": "stop_regex",
}


@dataclass
class GenParams:
    """Per-gen overrides (None = inherit the run() defaults)."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    n: int | None = None  # samples of one gen: the variable gets a list
    regex: str | None = None
    json_schema: str | None = None
    dtype: Any = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    lora_path: str | None = None  # the LoRA adapter this gen runs with (None: the base model)

    def resolve(self, defaults: "GenParams") -> tuple[dict[str, Any], dict[str, Any]]:
        """Merge over `defaults`; returns (sampling_params for the runtime, the request's other
        options: logprobs, lora_path)."""
        merged = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(defaults, f.name)
            for f in dataclasses.fields(self)
        }
        sampling = {
            _SAMPLING_NAMES[k]: v
            for k, v in merged.items()
            if k in _SAMPLING_NAMES and v is not None
        }
        if isinstance(sampling.get("stop"), str):
            sampling["stop"] = [sampling["stop"]]
        if "stop" in sampling:
            sampling["stop"] = list(sampling["stop"])
        dtype = merged["dtype"]
        if dtype is not None:
            key = dtype.__name__ if isinstance(dtype, type) else str(dtype)
            if key not in _DTYPE_REGEX:
                raise ValueError(f"gen dtype must be one of int, float, bool, str; got {dtype!r}")
            sampling["regex"], extra_stop = _DTYPE_REGEX[key]
            sampling.pop("json_schema", None)
            sampling["stop"] = list(sampling.get("stop", [])) + [
                s for s in extra_stop if s not in sampling.get("stop", [])
            ]
        logprob = {
            k: merged[k]
            for k in (
                "return_logprob",
                "logprob_start_len",
                "top_logprobs_num",
                "return_text_in_logprobs",
                "lora_path",
            )
            if merged[k] is not None
        }
        return sampling, logprob


def json_schema_string(schema: Any) -> str | None:
    """Accept a JSON string, a dict, or a pydantic model class, as users pass all three."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise ValueError(
        f"json_schema must be a JSON string, a dict or a pydantic model, got "
        f"{type(schema).__name__}"
    )


class Expr:
    """Anything that can be appended to a program state."""

    def __add__(self, other: Any) -> "ExprList":
        return ExprList(_flatten(self) + _flatten(as_expr(other)))

    def __radd__(self, other: Any) -> "ExprList":
        return ExprList(_flatten(as_expr(other)) + _flatten(self))


def as_expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return ConstantText(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return ConstantText(str(x))
    raise TypeError(
        f"cannot append {type(x).__name__} to a program state; append str, gen(...), select(...) "
        "or a role"
    )


def _flatten(e: Expr) -> list[Expr]:
    return list(e.items) if isinstance(e, ExprList) else [e]


class ExprList(Expr):
    def __init__(self, items: list[Expr]):
        self.items = items

    def __repr__(self) -> str:
        return f"ExprList({self.items!r})"


class ConstantText(Expr):
    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return f"Text({self.value!r})"


class Gen(Expr):
    def __init__(self, name: str | None, params: GenParams):
        self.name = name
        self.params = params

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class Select(Expr):
    def __init__(
        self, name: str | None, choices: list[str], temperature: float, choices_method: Any
    ):
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ValueError("select choices must be a non-empty list of strings")
        if not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"select choices must be non-empty strings, got {choices!r}")
        if not (isinstance(temperature, (int, float)) and temperature >= 0):
            raise ValueError(f"select temperature must be >= 0, got {temperature!r}")
        self.name = name
        self.choices = list(choices)
        self.temperature = float(temperature)
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, {self.choices!r})"


class RoleBegin(Expr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class RoleEnd(Expr):
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class VarScopeBegin(Expr):
    def __init__(self, name: str):
        self.name = name


class VarScopeEnd(Expr):
    def __init__(self, name: str):
        self.name = name


class ConcatAndAppend(Expr):
    """join(mode="concate_and_append"): the branches' new text, appended in order."""

    def __init__(self, states: list[Any]):
        self.states = states


def produced_names(e: Expr) -> list[str]:
    """Variables that executing `e` will set (so readers can wait on them)."""
    if isinstance(e, ExprList):
        return [n for item in e.items for n in produced_names(item)]
    if isinstance(e, (Gen, Select)) and e.name is not None:
        return [e.name]
    if isinstance(e, VarScopeBegin):
        return [e.name]
    return []
