"""radixrt: a structured-generation LLM runtime with an SGLang-compatible DSL.

    import radixrt as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

`import radixrt` loads only the DSL (no torch); `radixrt.Engine` is imported on first use.
"""

from typing import Any

from radixrt.frontend import (
    Backend,
    BackendError,
    ChatTemplate,
    ChoicesDecision,
    EngineBackend,
    Function,
    OpenAI,
    ProgramError,
    ProgramState,
    ProgramStateGroup,
    Runtime,
    RuntimeEndpoint,
    SglFunction,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    greedy_token_selection,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
    video,
)

__version__ = "0.1.0"


class _GlobalConfig:
    """SGLang programs sometimes set sgl.global_config.verbosity; accepted, unused."""

    verbosity = 0
    enable_precache_with_tracing = True


global_config = _GlobalConfig()


def __getattr__(name: str) -> Any:
    # Engine pulls in torch and the model code: import it only when it is asked for.
    if name == "Engine":
        from radixrt.runtime.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixrt' has no attribute {name!r}")


__all__ = [
    "Engine",
    "Runtime",
    "RuntimeEndpoint",
    "EngineBackend",
    "OpenAI",
    "Backend",
    "BackendError",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "ChatTemplate",
    "ChoicesDecision",
    "Function",
    "SglFunction",
    "function",
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
    "greedy_token_selection",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "global_config",
    "__version__",
]
