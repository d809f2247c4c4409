"""Tracing: run a program with stand-in arguments to find its constant prefix.

Everything a program appends before it first touches an argument, reads a generated
value, generates, selects or forks is the same text for every call: `run_batch` caches
(and pins) that prefix once so the batch's programs all hit it. A stand-in argument
stops the trace the moment it is used (formatted, added, iterated, ...).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from radixrt.frontend import ir


class StopTracing(Exception):
    pass


class ArgumentPlaceholder(ir.Expr):
    """Stands for a program argument whose value is unknown while tracing. Like SGLang's,
    `"Q: " + arg` still builds an expression list, so the text before it is kept."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _stop(self, *args: Any, **kwargs: Any) -> Any:
        raise StopTracing(f"argument {self._name!r} used")

    __str__ = __format__ = __iter__ = __len__ = __getitem__ = _stop
    __bool__ = __int__ = __float__ = __index__ = __contains__ = __call__ = _stop
    __mul__ = __rmul__ = __mod__ = __rmod__ = __lt__ = __gt__ = __le__ = __ge__ = _stop

    def __getattr__(self, name: str) -> Any:
        raise StopTracing(f"argument {self._name!r} used")

    def __repr__(self) -> str:
        return f"<argument {self._name}>"


@dataclass
class TraceResult:
    prefix: str = ""  # constant text appended before the first dynamic step
    nodes: list[ir.Expr] = field(default_factory=list)  # the constant nodes, in order
    stopped_by: str = "end of program"

    def __str__(self) -> str:
        return self.prefix


class TracerState:
    """Plays the `s` of a program while tracing; records constant text only."""

    def __init__(self, chat_template: Any):
        self.chat_template = chat_template
        self.result = TraceResult()
        self._has_messages = False
        self._role: str | None = None

    def __iadd__(self, other: Any) -> "TracerState":
        self._append(ir.as_expr(other))
        return self

    def _append(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.ExprList):
            for item in expr.items:
                self._append(item)
            return
        if isinstance(expr, ir.ConstantText):
            self.result.prefix += expr.value
        elif isinstance(expr, ir.RoleBegin):
            if (
                not self._has_messages
                and expr.role != "system"
                and self.chat_template.default_system_prompt
            ):
                self._append(
                    ir.ExprList(
                        [
                            ir.RoleBegin("system"),
                            ir.ConstantText(self.chat_template.default_system_prompt),
                            ir.RoleEnd("system"),
                        ]
                    )
                )
            self._role = expr.role
            self.result.prefix += self.chat_template.get_prefix_and_suffix(expr.role)[0]
        elif isinstance(expr, ArgumentPlaceholder):
            raise StopTracing(f"argument {expr._name!r} appended")
        elif isinstance(expr, ir.RoleEnd):
            self._has_messages = True
            self._role = None
            self.result.prefix += self.chat_template.get_prefix_and_suffix(expr.role)[1]
        else:
            raise StopTracing(f"{type(expr).__name__} is dynamic")
        self.result.nodes.append(expr)

    def _role_call(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self._append(ir.RoleBegin(role))
            self += expr
            self._append(ir.RoleEnd(role))
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self._append(ir.RoleBegin(role))
            yield
            self._append(ir.RoleEnd(role))

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role_call("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role_call("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role_call("assistant", expr)

    def text(self) -> str:
        return self.result.prefix

    def __getattr__(self, name: str) -> Any:
        # fork, s["x"], get_meta_info, var_scope, ...: the rest depends on run-time values.
        raise StopTracing(f"s.{name}")

    def __getitem__(self, name: str) -> Any:
        raise StopTracing(f"s[{name!r}] read")


def trace_program(
    function: Any, chat_template: Any, arguments: dict[str, Any] | None = None
) -> TraceResult:
    """Run `function` with placeholders for every argument not given in `arguments`."""
    given = {**function.bind_arguments, **(arguments or {})}
    unknown = sorted(set(given) - set(function.arg_names))
    if unknown:
        raise ValueError(f"{function.name}() has no argument(s) {', '.join(unknown)}")
    kwargs = {name: given.get(name, ArgumentPlaceholder(name)) for name in function.arg_names}
    kwargs.update({k: v for k, v in given.items() if k in function.arg_names})
    state = TracerState(chat_template)
    try:
        function.func(state, **kwargs)
    except StopTracing as e:
        state.result.stopped_by = str(e)
    except Exception as e:  # the program computed on a placeholder: the prefix so far stands
        state.result.stopped_by = f"{type(e).__name__}: {e}"
    return state.result


def signature_names(func: Any) -> tuple[list[str], dict[str, Any]]:
    """Argument names after `s` and their defaults."""
    params = list(inspect.signature(func).parameters.values())
    if not params or params[0].name != "s":
        raise ValueError(
            f"the first argument of a @function program must be `s`, "
            f"got {params[0].name if params else 'none'} in {func.__name__}"
        )
    names, defaults = [], {}
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        names.append(p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return names, defaults
