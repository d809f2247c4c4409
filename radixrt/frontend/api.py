"""The public DSL, with SGLang's names and signatures: `import radixrt as sgl`.

@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=64))

state = qa.run(question="Why is the sky blue?", temperature=0)
print(state["answer"])

This module holds programs (`function` / `Function`: run, run_batch, trace, cache) and the backend
helpers; the expressions a program appends (gen, select, the roles) are primitives.py's, re-exported
here.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from radixrt.frontend import ir
from radixrt.frontend.errors import for_user
from radixrt.frontend.primitives import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixrt.frontend.runner import (
    cache_program,
    get_default_backend,
    resolve_backend,
    run_program,
    run_program_batch,
    set_default_backend,
)
from radixrt.frontend.tracer import TraceResult, signature_names, trace_program

__all__ = [
    "function",
    "Function",
    "SglFunction",
    "gen",
    "gen_int",
    "gen_string",
    "select",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "set_default_backend",
    "get_default_backend",
    "flush_cache",
    "get_server_info",
    "image",
    "video",
]


def _defaults(
    max_new_tokens: int = 128,
    min_new_tokens: int | None = None,
    stop: Any = (),
    stop_token_ids: Any = (),
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repetition_penalty: float | None = None,
    ignore_eos: bool = False,
    seed: int | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    lora_path: str | None = None,
) -> ir.GenParams:
    """run()'s sampling defaults (SGLang's): every gen inherits what it does not set."""
    return ir.GenParams(
        max_tokens=max_new_tokens,
        min_tokens=min_new_tokens,
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        stop_token_ids=list(stop_token_ids or []),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
        lora_path=lora_path,
    )


_SAMPLING_KEYS = frozenset(_defaults.__code__.co_varnames[: _defaults.__code__.co_argcount])


class Function:
    """A program: a Python function whose first argument is the state `s`."""

    def __init__(
        self,
        func: Callable,
        bind_arguments: dict[str, Any] | None = None,
        num_api_spec_tokens: int | None = None,
    ):
        self.func = func
        self.name = getattr(func, "__name__", "program")
        self.arg_names, self.arg_defaults = signature_names(func)
        self.bind_arguments = dict(bind_arguments or {})
        self.num_api_spec_tokens = num_api_spec_tokens
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> "Function":
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise ValueError(f"{self.name}() has no argument(s) {', '.join(unknown)}")
        return Function(self.func, {**self.bind_arguments, **kwargs}, self.num_api_spec_tokens)

    def run(
        self,
        *args: Any,
        stream: bool = False,
        backend: Any = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run once; returns the ProgramState. Keyword arguments named like sampling parameters
        (max_new_tokens, temperature, stop, ...) set the defaults of every gen; the others are the
        program's arguments. session_id: a multi-turn program's runs are turns of one conversation;
        the runtime keeps the last one cached until the next (or close_session)."""
        sampling = {
            k: kwargs.pop(k)
            for k in list(kwargs)
            if k in _SAMPLING_KEYS and k not in self.arg_names
        }
        state, error = run_program(
            self, backend, args, kwargs, _defaults(**sampling), stream=stream, session_id=session_id
        )
        if error is not None:
            raise for_user(error)
        return state

    def run_batch(
        self,
        batch_kwargs: list,
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        **sampling: Any,
    ) -> list:
        unknown = sorted(set(sampling) - _SAMPLING_KEYS)
        if unknown:
            raise ValueError(f"run_batch got unknown keyword(s): {', '.join(unknown)}")
        return run_program_batch(
            self, backend, batch_kwargs, _defaults(**sampling), num_threads, progress_bar
        )

    def trace(self, *, backend: Any = None, **kwargs: Any) -> TraceResult:
        """The constant prefix the program appends before anything dynamic."""
        return trace_program(self, resolve_backend(backend).get_chat_template(), kwargs)

    def cache(self, backend: Any = None) -> None:
        """Pre-cache the program's constant prefix in the runtime's radix cache."""
        cache_program(self, backend)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<radixrt function {self.name}>"


SglFunction = Function


def function(func: Callable | None = None, num_api_spec_tokens: int | None = None) -> Any:
    if func is not None:
        return Function(func, num_api_spec_tokens=num_api_spec_tokens)
    return lambda f: Function(f, num_api_spec_tokens=num_api_spec_tokens)


def flush_cache(backend: Any = None) -> bool:
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: Any = None) -> dict:
    return resolve_backend(backend).get_server_info()


def image(expr: Any) -> ir.Expr:
    raise NotImplementedError("radixrt serves text-only models: sgl.image is not supported")


def video(path: str, num_frames: int) -> ir.Expr:
    raise NotImplementedError("radixrt serves text-only models: sgl.video is not supported")
