"""StreamExecutor: runs one program state's expressions, in order, on a worker thread.

`s += gen(...)` only queues; the program thread continues until it reads a value
(`s["x"]`, `s.text()`), which waits. That is what lets fork branches run in parallel
and their requests meet in one batch on the runtime. A failure stops the state: queued
expressions are dropped, waiters wake up, and the next read or append raises a
ProgramError naming the program line that appended the failing expression.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from radixrt.frontend import ir
from radixrt.frontend.errors import CallSite, ProgramError, user_call_site
from radixrt.frontend.program import Program


class StreamExecutor:
    def __init__(self, program: Program):
        self.program = program
        self.backend = program.backend
        self.stream = program.stream
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.meta_info: dict[str, Any] = {}
        self.cur_role: str | None = None
        self.cur_role_begin_pos: int | None = None
        self.fork_start_text_pos: int | None = None
        self.error_: ProgramError | None = None
        self.is_finished = False
        self.version = 0  # bumped on every visible change; streaming readers wait on it
        self.changed = threading.Condition()
        self._pending: collections.deque = collections.deque()
        self._busy = False
        self._closed = False
        self._cv = threading.Condition()
        program.executors.append(self)
        self._worker = threading.Thread(target=self._work, name="radixrt-program", daemon=True)
        self._worker.start()

    # ---- queue -------------------------------------------------------------------------
    def submit(self, expr: ir.Expr, site: CallSite | None = None) -> None:
        site = site or user_call_site()
        with self._cv:
            if self.error_ is not None:
                raise self.error_.again()
            if self._closed:
                raise RuntimeError(
                    "this program state has ended (its program returned or it was joined)"
                )
            for name in ir.produced_names(expr):
                self.variable_event[name] = threading.Event()
            self._pending.append((expr, site))
            self._cv.notify_all()

    def sync(self) -> None:
        with self._cv:
            while self._pending or self._busy:
                self._cv.wait()

    def end(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    break
                expr, site = self._pending.popleft()
                self._busy = True
            try:
                self._execute(expr)
            except Exception as e:
                error = e if isinstance(e, ProgramError) else ProgramError(_describe(expr), e, site)
                with self._cv:
                    self.error_ = error
                    self._pending.clear()
                    self._busy = False
                    self._cv.notify_all()
                for event in self.variable_event.values():
                    event.set()
                break
            finally:
                self.notify_changed()
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        self.is_finished = True
        self.notify_changed()

    def notify_changed(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    # ---- reads -------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        event = self.variable_event.get(name)
        if event is not None:
            event.wait()
        if name not in self.variables:
            if self.error_ is not None:
                raise self.error_.again()
            raise KeyError(
                f"program variable {name!r} was never set (variables: {sorted(self.variables)})"
            )
        return self.variables[name]

    def get_meta_info(self, name: str) -> Any:
        event = self.variable_event.get(name)
        if event is not None:
            event.wait()
        return self.meta_info.get(name)

    def raise_if_failed(self) -> None:
        if self.error_ is not None:
            raise self.error_.again()

    # ---- execution ---------------------------------------------------------------------
    def _execute(self, expr: ir.Expr) -> None:
        if isinstance(expr, ir.ExprList):
            for item in expr.items:
                self._execute(item)
        elif isinstance(expr, ir.ConstantText):
            self._fill(expr.value)
        elif isinstance(expr, ir.Gen):
            self._gen(expr)
        elif isinstance(expr, ir.Select):
            self._select(expr)
        elif isinstance(expr, ir.RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, ir.RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, ir.VarScopeBegin):
            self.variables[expr.name] = len(self.text_)
        elif isinstance(expr, ir.VarScopeEnd):
            self.variables[expr.name] = self.text_[self.variables[expr.name] :]
            self.variable_event[expr.name].set()
        elif isinstance(expr, ir.ConcatAndAppend):
            for state in expr.states:
                branch = state.stream_executor
                branch.sync()
                branch.raise_if_failed()
                self._fill(branch.text_[branch.fork_start_text_pos :])
        else:
            raise TypeError(f"cannot execute {type(expr).__name__}")

    def _fill(self, value: str) -> None:
        self.text_ += str(value)
        self.notify_changed()

    def _sampling(self, gen: ir.Gen) -> tuple[dict[str, Any], dict[str, Any]]:
        sampling, logprob = gen.params.resolve(self.program.defaults)
        stop = list(sampling.get("stop", []))
        for s in self.program.chat_template.stop_str:
            if s not in stop:
                stop.append(s)
        if stop:
            sampling["stop"] = stop
        return sampling, logprob

    def _set(self, name: str | None, value: Any, meta: Any) -> None:
        if name is None:
            return
        self.variables[name] = value
        self.meta_info[name] = meta
        self.variable_event[name].set()

    def _gen(self, gen: ir.Gen) -> None:
        sampling, logprob = self._sampling(gen)
        pid = self.program.program_id
        if self.program.session_id is not None:
            logprob = {**logprob, "session_id": self.program.session_id}
        # a chat API (sgl.OpenAI): the finished messages
        if getattr(self.backend, "wants_messages", False):
            logprob = {**logprob, "messages": list(self.messages_)}
        if not self.stream or sampling.get("n", 1) > 1:
            text, meta = self.backend.generate(self.text_, sampling, program_id=pid, **logprob)
            # n > 1: the variable (and its meta info) holds every sample, in order; the program's
            # text goes on with the first, as SGLang's interpreter does (a stream gets it whole, at
            # the end)
            self._fill(text[0] if isinstance(text, list) else text)
            self._set(gen.name, text, meta)
            return
        value, meta = "", None
        if gen.name is not None:
            self.variables[gen.name] = value
        for delta, chunk_meta in self.backend.generate_stream(
            self.text_, sampling, program_id=pid, **logprob
        ):
            value += delta
            meta = merge_stream_meta(meta, chunk_meta)
            if gen.name is not None:
                self.variables[gen.name] = value
                self.meta_info[gen.name] = meta
            self._fill(delta)
        self._set(gen.name, value, meta)

    def _select(self, sel: ir.Select) -> None:
        chat = (
            {"messages": list(self.messages_)}
            if getattr(self.backend, "wants_messages", False)
            else {}
        )
        decision = self.backend.select(
            self.text_,
            sel.choices,
            sel.temperature,
            sel.choices_method,
            program_id=self.program.program_id,
            **chat,
        )
        self._fill(decision.decision)
        self._set(sel.name, decision.decision, decision.meta_info)

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(
                f"role {role!r} begins inside role {self.cur_role!r}: roles cannot nest"
            )
        template = self.program.chat_template
        if not self.messages_ and role != "system" and template.default_system_prompt:
            # The model's template adds its default system turn; do the same so the text
            # equals what a chat request would send.
            self._role_begin("system")
            self._fill(template.default_system_prompt)
            self._role_end("system")
        prefix, _ = template.get_prefix_and_suffix(role, self.messages_)
        self.cur_role = role
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the open role is {self.cur_role!r}")
        content = self.text_[self.cur_role_begin_pos :].lstrip()
        _, suffix = self.program.chat_template.get_prefix_and_suffix(role, self.messages_)
        self.cur_role = None
        self._fill(suffix)
        self.messages_.append({"role": role, "content": content})

    # ---- fork --------------------------------------------------------------------------
    def fork(self, size: int, site: CallSite | None) -> tuple[list["StreamExecutor"], Any]:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be an int >= 1, got {size!r}")
        self.sync()
        self.raise_if_failed()
        handle = None
        if size > 1 and self.text_:
            # Prefill the shared prefix once, before the branches send their requests,
            # so each branch's request finds it in the radix cache.
            try:
                handle = self.program.pin(self.text_)
            except Exception as e:
                raise ProgramError(f"fork({size})", e, site) from e
        branches = []
        for _ in range(size):
            exe = StreamExecutor(self.program)
            exe.text_ = self.text_
            exe.messages_ = list(self.messages_)
            exe.variables = dict(self.variables)
            exe.meta_info = dict(self.meta_info)
            exe.cur_role = self.cur_role
            exe.cur_role_begin_pos = self.cur_role_begin_pos
            exe.fork_start_text_pos = len(self.text_)
            branches.append(exe)
        return branches, handle


def _describe(expr: ir.Expr) -> str:
    if isinstance(expr, ir.ExprList):
        inner = [
            e for e in expr.items if not isinstance(e, (ir.ConstantText, ir.RoleBegin, ir.RoleEnd))
        ]
        return (
            _describe(inner[0])
            if len(inner) == 1
            else "appending " + ", ".join(_describe(e) for e in expr.items)
        )
    if isinstance(expr, ir.Gen):
        return f"gen({expr.name!r})"
    if isinstance(expr, ir.Select):
        return f"select({expr.name!r})"
    if isinstance(expr, (ir.RoleBegin, ir.RoleEnd)):
        return f"role {expr.role!r}"
    if isinstance(expr, ir.ConstantText):
        return "text"
    return type(expr).__name__


STREAMED_LOGPROB_KEYS = (
    "output_token_logprobs",
    "output_top_logprobs",
)  # a stream chunk carries only its own


def merge_stream_meta(meta: dict | None, chunk: dict) -> dict:
    """The meta info of a streamed gen so far: the chunk's totals, with the per-chunk logprobs added
    up."""
    if not meta:
        return dict(chunk)
    merged = dict(chunk)
    for key in STREAMED_LOGPROB_KEYS:
        if key in meta or key in chunk:
            merged[key] = list(meta.get(key, [])) + list(chunk.get(key, []))
    return merged
