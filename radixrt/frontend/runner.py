"""Running programs: one (`run`), streamed, or many at once (`run_batch`), and the
default backend.

`run` returns once the program and all its requests are done and raises the first
failure (trimmed to the user's lines). `run_batch` never loses the batch to one bad
program: a failed program's state carries the error (`state.error()`; reading its
text raises it). Before a batch starts, its constant prefix (found by tracing) is
cached once, and pinned while the batch runs when the backend can pin.
"""

from __future__ import annotations

import inspect
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixrt.frontend import ir
from radixrt.frontend.errors import CallSite, ProgramError, _is_internal
from radixrt.frontend.interpreter import StreamExecutor
from radixrt.frontend.program import Program
from radixrt.frontend.state import ProgramState
from radixrt.frontend.tracer import trace_program

logger = logging.getLogger("radixrt")

PRECACHE_MIN_CHARS = 64  # shorter constant prefixes are not worth a request of their own
AUTO_NUM_THREADS = 64  # about the runtime's max_running_requests: enough to fill a batch

_default_backend: Any = None
_default_lock = threading.Lock()
_engine_backends: dict[int, Any] = {}


def set_default_backend(backend: Any) -> None:
    global _default_backend
    _default_backend = resolve_backend(backend) if backend is not None else None


def get_default_backend() -> Any:
    """The backend set with set_default_backend, else an in-process Engine on the default model."""
    global _default_backend
    with _default_lock:
        if _default_backend is None:
            from radixrt.frontend.backends import EngineBackend

            logger.info("no backend set: starting an in-process Engine on the default model")
            _default_backend = EngineBackend()
        return _default_backend


def resolve_backend(backend: Any) -> Any:
    """Accept a frontend backend, a Runtime, an Engine, or a server URL."""
    from radixrt.frontend.backends import Backend, EngineBackend
    from radixrt.frontend.endpoint import RuntimeEndpoint

    if backend is None:
        return get_default_backend()
    if isinstance(backend, Backend):
        return backend
    if isinstance(getattr(backend, "__dict__", {}).get("endpoint"), Backend):  # Runtime
        return backend.endpoint
    if isinstance(backend, str):
        return RuntimeEndpoint(backend)
    if callable(getattr(backend, "generate", None)) and hasattr(backend, "tokenizer"):  # Engine
        with _default_lock:
            wrapped = _engine_backends.get(id(backend))
            if wrapped is None or wrapped.engine is not backend:
                wrapped = _engine_backends[id(backend)] = EngineBackend(backend)
        return wrapped
    raise ValueError(
        f"not a backend: {backend!r} (use RuntimeEndpoint(url), Runtime(...), Engine(...) "
        "or a frontend backend)"
    )


def bind_arguments(function: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = inspect.signature(function.func).bind(
        None, *args, **{**function.bind_arguments, **kwargs}
    )
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # the state `s`
    return arguments


def _site_of(exc: BaseException) -> CallSite | None:
    tb, site = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_internal(code.co_filename):
            site = CallSite(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return site


def _execute(
    function: Any, arguments: dict, program: Program, state: ProgramState
) -> BaseException | None:
    """Run the program body; returns its failure (also recorded on the state)."""
    error: BaseException | None = None
    try:
        state.ret_value = function.func(state, **arguments)
    except Exception as e:  # noqa: BLE001 - re-raised below or stored on the state
        error = e
    finally:
        program.finish()
    exe = state.stream_executor
    if error is None and exe.error_ is not None:
        error = exe.error_.again()
    if error is None:
        return None
    if exe.error_ is None:
        exe.error_ = (
            error
            if isinstance(error, ProgramError)
            else ProgramError(f"{function.name}()", error, _site_of(error))
        )
        exe.notify_changed()
    return error


def run_program(
    function: Any,
    backend: Any,
    args: tuple,
    kwargs: dict,
    defaults: ir.GenParams,
    stream: bool = False,
    session_id: str | None = None,
) -> tuple[ProgramState, BaseException | None]:
    """Run (or, streaming, start) the program; returns its state and its failure, if any."""
    arguments = bind_arguments(function, args, kwargs)
    program = Program(resolve_backend(backend), defaults, stream, session_id=session_id)
    state = ProgramState(StreamExecutor(program))
    if stream:
        threading.Thread(
            target=_execute,
            args=(function, arguments, program, state),
            name="radixrt-stream",
            daemon=True,
        ).start()
        return state, None
    return state, _execute(function, arguments, program, state)


def cache_program(function: Any, backend: Any) -> tuple[Any, Any]:
    """Trace the program's constant prefix and cache it; returns (pin handle or None, program).

    The returned Program owns the pin: call `program.finish()` to release it."""
    backend = resolve_backend(backend)
    prefix = trace_program(function, backend.get_chat_template()).prefix
    if len(prefix) < PRECACHE_MIN_CHARS:
        return None, None
    program = Program(backend, ir.GenParams(), stream=False)
    return program.pin(prefix), program


def run_program_batch(
    function: Any,
    backend: Any,
    batch_arguments: list,
    defaults: ir.GenParams,
    num_threads: int | str = "auto",
    progress_bar: bool = False,
) -> list[ProgramState]:
    backend = resolve_backend(backend)
    if not isinstance(batch_arguments, (list, tuple)):
        raise ValueError("run_batch takes a list of argument dicts (or tuples)")
    if not batch_arguments:
        return []
    batch = [
        dict(a) if isinstance(a, dict) else bind_arguments(function, tuple(a), {})
        for a in batch_arguments
    ]
    if num_threads == "auto":
        num_threads = AUTO_NUM_THREADS
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or an int >= 1, got {num_threads!r}")
    num_threads = min(num_threads, len(batch))

    precache = None
    if len(batch) > 1:
        try:
            _, precache = cache_program(function, backend)
        except (ConnectionError, PermissionError):
            raise
        except Exception as e:  # pre-caching is an optimization: never fail the batch for it
            logger.warning("could not pre-cache the batch's prefix: %s", e)
    bar = None
    if progress_bar:
        import tqdm

        bar = tqdm.tqdm(total=len(batch))

    def one(arguments: dict) -> ProgramState:
        try:
            state, error = run_program(function, backend, (), arguments, defaults)
            if error is not None:
                logger.warning("program %s failed: %s", function.name, state.stream_executor.error_)
            return state
        finally:
            if bar is not None:
                bar.update()

    try:
        if num_threads == 1:
            states = [one(a) for a in batch]
        else:
            with ThreadPoolExecutor(num_threads, thread_name_prefix="radixrt-batch") as pool:
                states = list(pool.map(one, batch))
    finally:
        if precache is not None:
            precache.finish()
        if bar is not None:
            bar.close()
    return states
