"""The radixrt DSL (SGLang-compatible). Nothing in this package imports torch."""

from radixrt.frontend.api import (
    Function,
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
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixrt.frontend.backends import Backend, BackendError, EngineBackend
from radixrt.frontend.chat_template import ChatTemplate
from radixrt.frontend.choices import (
    ChoicesDecision,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixrt.frontend.endpoint import RuntimeEndpoint
from radixrt.frontend.errors import ProgramError
from radixrt.frontend.launcher import Runtime
from radixrt.frontend.openai_backend import OpenAI
from radixrt.frontend.state import ProgramState, ProgramStateGroup
