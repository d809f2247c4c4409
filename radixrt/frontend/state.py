"""ProgramState (the `s` a program receives) and ProgramStateGroup (what fork returns).

The SGLang surface: `s += expr`, `s["x"]`, `s.text()`, `s.messages()`,
`s.get_meta_info(name)`, `with s.user():`, `with s.var_scope("x"):`, `s.fork(n)`,
`s.copy()`, `state.text_iter(name)`, `state.text_async_iter(name)`.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator

from radixrt.frontend import ir
from radixrt.frontend.errors import user_call_site
from radixrt.frontend.interpreter import StreamExecutor


class ProgramState:
    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    # ---- appending -----------------------------------------------------------------------
    def __iadd__(self, other: Any) -> "ProgramState":
        if other is None:
            raise ValueError("tried to append None to a program state")
        self.stream_executor.submit(ir.as_expr(other), user_call_site())
        return self

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self.stream_executor.submit(
                ir.ExprList([ir.RoleBegin(role), ir.as_expr(expr), ir.RoleEnd(role)]),
                user_call_site(),
            )
            return None

        @contextmanager
        def scope() -> Iterator[None]:
            self.stream_executor.submit(ir.RoleBegin(role), user_call_site())
            yield
            self.stream_executor.submit(ir.RoleEnd(role), user_call_site())

        return scope()

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        self.stream_executor.submit(ir.VarScopeBegin(name), user_call_site())
        yield
        self.stream_executor.submit(ir.VarScopeEnd(name), user_call_site())

    # ---- fork ----------------------------------------------------------------------------
    def fork(self, size: int = 1, position_ids_offset: Any = None) -> "ProgramStateGroup":
        # branches always continue at their own next position here
        if position_ids_offset is not None:
            raise NotImplementedError(
                "fork(position_ids_offset=...) is not supported: radixrt gives every token "
                "its position in the sequence"
            )
        site = user_call_site()
        branches, handle = self.stream_executor.fork(size, site)
        return ProgramStateGroup([ProgramState(b) for b in branches], self, handle)

    @contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator["ProgramState"]:
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading -------------------------------------------------------------------------
    def text(self) -> str:
        self.stream_executor.sync()
        self.stream_executor.raise_if_failed()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.stream_executor.sync()
        self.stream_executor.raise_if_failed()
        return list(self.stream_executor.messages_)

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> Exception | None:
        self.stream_executor.sync()
        return self.stream_executor.error_

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.variables[name] = value

    def get_meta_info(self, name: str) -> Any:
        return self.stream_executor.get_meta_info(name)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    @property
    def program_id(self) -> str:
        return self.stream_executor.program.program_id

    def __repr__(self) -> str:
        exe = self.stream_executor
        status = (
            "failed" if exe.error_ is not None else "finished" if exe.is_finished else "running"
        )
        return f"<ProgramState {status} {exe.text_[-200:]!r}>"

    # ---- streaming -----------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield new text as it is produced: the whole program's, or one variable's."""
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        pos, seen = 0, -1
        while True:
            with exe.changed:
                while exe.version == seen and not exe.is_finished and not _var_done(exe, var_name):
                    exe.changed.wait()
                seen = exe.version
                current = exe.text_ if var_name is None else exe.variables.get(var_name, "")
                done = exe.is_finished or _var_done(exe, var_name)
            current = current if isinstance(current, str) else str(current)
            if len(current) > pos:
                yield current[pos:]
                pos = len(current)
            if done:
                if (
                    exe.error_ is not None
                    and var_name is not None
                    and var_name not in exe.variables
                ):
                    raise exe.error_.again()
                return

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        it = self.text_iter(var_name)
        end = object()
        while True:
            chunk = await loop.run_in_executor(None, next, it, end)
            if chunk is end:
                return
            if return_meta_data:
                yield chunk, self.stream_executor.meta_info.get(var_name)
            else:
                yield chunk


def _var_done(exe: StreamExecutor, var_name: str | None) -> bool:
    if var_name is None:
        return False
    event = exe.variable_event.get(var_name)
    return event is not None and event.is_set()


class ProgramStateGroup:
    """The branches of a fork. `join()` waits for them, gathers their new variables into
    the parent as lists, and releases the pinned shared prefix."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState, pin_handle: Any = None):
        self.states = states
        self.src_state = src_state
        self.pin_handle = pin_handle
        self.joined = False

    def join(self, mode: str = "gather_variable") -> None:
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(
                f"join mode must be gather_variable or concate_and_append, got {mode!r}"
            )
        program = self.src_state.stream_executor.program
        try:
            for state in self.states:
                state.stream_executor.sync()
            for state in self.states:
                state.stream_executor.raise_if_failed()
            if mode == "gather_variable":
                src_vars = self.src_state.stream_executor.variables
                before = set(src_vars)
                for state in self.states:
                    for name, value in state.stream_executor.variables.items():
                        if name not in before:
                            src_vars.setdefault(name, []).append(value)
            else:
                self.src_state.stream_executor.submit(
                    ir.ConcatAndAppend(self.states), user_call_site()
                )
                self.src_state.stream_executor.sync()
                self.src_state.stream_executor.raise_if_failed()
        finally:
            for state in self.states:
                state.stream_executor.end()
            program.unpin(self.pin_handle)
            self.joined = True

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """`forks[i] += "..."` extends branch i in place (Python then stores the same state back);
        a branch cannot be replaced by another state."""
        if value is not self.states[i]:
            raise TypeError(f"fork branch {i} cannot be replaced; extend it with forks[{i}] += ...")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        site = user_call_site()
        if callable(other) and not isinstance(other, ir.Expr):
            items = [other(i) for i in range(len(self.states))]
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(
                    f"appending {len(other)} items to {len(self.states)} fork branches"
                )
            items = list(other)
        else:
            items = [other] * len(self.states)
        for state, item in zip(self.states, items):
            state.stream_executor.submit(ir.as_expr(item), site)
        return self
