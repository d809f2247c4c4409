"""The Hermes envelope a grammar writes, read as it is generated: tool_choice `required` or a
named function (the text is constrained by constrained/tool_call_regex.py, so every call is valid),
and `auto` without --tool-call-parser (its second, constrained phase). Unlike the checked parsers
of free text (checked.py), arguments stream out as they are generated.

The text is content with calls in the fallback (Hermes-style) format of tool_calls.py:
`<tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>`. Feeding the text in any split
yields the same events in the same order (only how content and arguments are cut into fragments
differs): content fragments, then per call `CallStart(index, name)`, argument fragments that
concatenate to the arguments' exact JSON text as generated, and `CallEnd(index)`. A non-streamed
response feeds the whole text at once; a stream feeds each delta. Text is held back only while it
may still turn out to be the start of a tag or a call's closing brace, so a stream never sends a
fragment it has to take back.
"""

from __future__ import annotations

import json
import re

from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    Event,
    partial_len,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# the value has begun
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')
_OPENERS, _CLOSERS = "{[", "}]"


class _ArgsScan:
    """Where a call's JSON arguments end, found by reading each character once (strings, escapes
    and bracket depth tracked as they arrive): every piece of a stream costs what it adds, never a
    re-read of what came before. A "</tool_call>" inside a string argument is text, not the end."""

    def __init__(self, start: int) -> None:
        self.pos = start  # the next character of the buffer to read
        self.end: int | None = None  # where the arguments ended (one past their last character)
        self.depth = 0
        self.in_str = self.escaped = self.scalar = False
        self.after = 0  # how far the text after the arguments was read (whitespace, the brace)
        self.brace = False  # the wrapper's closing brace was read after them

    def advance(self, buf: str) -> None:
        while self.end is None and self.pos < len(buf):
            self._read(buf[self.pos])
            if self.end is None:
                self.pos += 1

    def _read(self, ch: str) -> None:
        if self.in_str:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 0:  # a string value alone
                    self.end = self.pos + 1
        elif self.scalar:  # a number, true, false or null ends before a delimiter
            if ch.isspace() or ch in "}],":
                self.end = self.pos
        elif ch == '"':
            self.in_str = True
        elif ch in _OPENERS:
            self.depth += 1
        elif ch in _CLOSERS:
            self.depth -= 1
            if self.depth == 0:
                self.end = self.pos + 1
        elif self.depth == 0 and not ch.isspace():
            self.scalar = True


class ToolCallParser:
    def __init__(self) -> None:
        self.buf = ""  # text not yet turned into events
        self.in_call = False
        self.num_calls = 0
        self._args_sent = 0  # characters of the current call's arguments already sent
        # where the arguments start in buf (None: head not parsed yet)
        self._args_at: int | None = None
        self._scan: _ArgsScan | None = None

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while True:
            before = (self.buf, self.in_call)
            events += self._call_step() if self.in_call else self._content_step()
            if (self.buf, self.in_call) == before:
                return events

    def finish(self) -> list[Event]:
        """End of output: held-back content goes out (but whitespace after the last call, which only
        separates calls). A call the output cut short (finish_reason "length") keeps the start and
        arguments already sent, and gets no CallEnd."""
        keep = not self.in_call and self.buf and not (self.num_calls and not self.buf.strip())
        events: list[Event] = [Content(self.buf)] if keep else []
        self.buf = ""
        return events

    def _content_step(self) -> list[Event]:
        at = self.buf.find(OPEN)
        if at >= 0:
            text, self.buf = self.buf[:at], self.buf[at + len(OPEN) :]
            self.in_call, self._args_at, self._args_sent = True, None, 0
            self._scan = None
            if self.num_calls and not text.strip():
                return []  # the newline between two calls is not content
            return [Content(text)] if text else []
        keep = partial_len(self.buf, OPEN)
        text = self.buf[: len(self.buf) - keep]
        if self.num_calls and not text.strip():
            return []  # whitespace after a call is held: dropped before the next call or at the end
        self.buf = self.buf[len(text) :]
        return [Content(text)] if text else []

    def _call_step(self) -> list[Event]:
        events: list[Event] = []
        index = self.num_calls
        if self._args_at is None:
            head = _HEAD.match(self.buf)
            if head is None:
                return events
            self._args_at = head.end()
            self._scan = _ArgsScan(self._args_at)
            events.append(CallStart(index, json.loads(head.group(1))))
        scan = self._scan
        scan.advance(self.buf)
        # what is read of the arguments is theirs for good (whitespace inside them included)
        safe = (scan.end if scan.end is not None else scan.pos) - self._args_at
        if safe > self._args_sent:
            sent_at = self._args_at + self._args_sent
            events.append(ArgsDelta(index, self.buf[sent_at : self._args_at + safe]))
            self._args_sent = safe
        end = self._call_end(scan)
        if end >= 0:  # the wrapper's brace and the closing tag followed the arguments
            self.buf = self.buf[end + len(CLOSE) :]
            self.in_call = False
            self.num_calls += 1
            return events + [CallEnd(index)]
        return events

    def _call_end(self, scan: _ArgsScan) -> int:
        """Where the call's CLOSE tag starts once whitespace, the wrapper's "}", whitespace and the
        whole tag followed the arguments; -1 until then (or for good, if anything else follows).
        Resumes where the last piece left off."""
        if scan.end is None:
            return -1
        buf, i = self.buf, max(scan.after, scan.end)
        while i < len(buf) and (buf[i].isspace() or (buf[i] == "}" and not scan.brace)):
            scan.brace |= buf[i] == "}"
            i += 1
        scan.after = i
        return i if scan.brace and buf.startswith(CLOSE, i) else -1
