"""Errors that point at the user's program line, not at the interpreter.

Expressions run on worker threads, so when a `gen` fails the Python stack is the
worker's. Each submitted expression remembers the line of the program that appended it
(`CallSite`); a failure becomes a ProgramError quoting that line, and the traceback the
user sees is trimmed of frames inside radixrt.frontend.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import types
from dataclasses import dataclass

_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKIP_FILES = {os.path.abspath(contextlib.__file__)}


def _is_internal(filename: str) -> bool:
    filename = os.path.abspath(filename) if not filename.startswith("<") else filename
    return filename.startswith(_FRONTEND_DIR) or filename in _SKIP_FILES


@dataclass(frozen=True)
class CallSite:
    filename: str
    lineno: int
    function: str

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        where = f'File "{self.filename}", line {self.lineno}, in {self.function}'
        return f"{where}\n    {self.line}" if self.line else where


def user_call_site() -> CallSite | None:
    """The innermost frame on this thread's stack that is not radixrt.frontend code."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    return CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


class ProgramError(RuntimeError):
    """A program step failed. `site` is the program line that appended the failing
    expression; `cause` the original exception (also chained as __cause__)."""

    def __init__(self, what: str, cause: BaseException, site: CallSite | None):
        self.what = what
        self.cause = cause
        self.site = site
        reason = f"{type(cause).__name__}: {cause}"
        where = f"\n  at {site}" if site is not None else ""
        super().__init__(f"{what} failed: {reason}{where}")

    def again(self) -> "ProgramError":
        """A fresh copy to raise at another read, so tracebacks do not pile up."""
        return ProgramError(self.what, self.cause, self.site)


def trim_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The same traceback without frames inside radixrt.frontend (user frames kept in order)."""
    frames = []
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            frames.append(tb)
        tb = tb.tb_next
    new_tb = None
    for old in reversed(frames):
        new_tb = types.TracebackType(new_tb, old.tb_frame, old.tb_lasti, old.tb_lineno)
    return new_tb


def for_user(exc: BaseException) -> BaseException:
    """`exc` with interpreter frames removed from its traceback, ready to raise."""
    if isinstance(exc, ProgramError):
        # The cause's own stack is a worker thread's; the message already names the user's line.
        exc.__suppress_context__ = True
        exc.__cause__ = None
    return exc.with_traceback(trim_traceback(exc.__traceback__))
