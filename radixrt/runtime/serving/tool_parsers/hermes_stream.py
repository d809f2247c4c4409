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

from radixrt.runtime.serving.tool_parsers.events import (
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
# what may still be the end of a call: whitespace, the wrapper's closing brace, whitespace, part of
# CLOSE
_TAIL = re.compile(r"\s*(?:\}\s*)?(?:<[/a-z_]*)?\Z")


class ToolCallParser:
    def __init__(self) -> None:
        self.buf = ""  # text not yet turned into events
        self.in_call = False
        self.num_calls = 0
        self._args_sent = 0  # characters of the current call's arguments already sent
        # where the arguments start in buf (None: head not parsed yet)
        self._args_at: int | None = None

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
            events.append(CallStart(index, json.loads(head.group(1))))
        end = self._call_end()
        if end >= 0:  # the call is complete: its arguments end before the wrapper's closing brace
            body = self.buf[self._args_at : end].rstrip()
            args = body[:-1].rstrip() if body.endswith("}") else body
            self.buf = self.buf[end + len(CLOSE) :]
            if args[self._args_sent :]:
                events.append(ArgsDelta(index, args[self._args_sent :]))
            self.in_call = False
            self.num_calls += 1
            return events + [CallEnd(index)]
        args = self.buf[self._args_at :]
        safe = len(args) - len(_TAIL.search(args).group(0))
        if safe > self._args_sent:
            events.append(ArgsDelta(index, args[self._args_sent : safe]))
            self._args_sent = safe
        return events

    def _call_end(self) -> int:
        """Where the call's CLOSE tag is: the first one after which the text before it is whole JSON
        arguments and the wrapper's brace (a string argument may itself contain "</tool_call>"); -1
        while none is."""
        at = self.buf.find(CLOSE, self._args_at)
        while at >= 0:
            body = self.buf[self._args_at : at].rstrip()
            if body.endswith("}"):
                try:
                    json.loads(body[:-1])
                    return at
                except ValueError:
                    pass
            at = self.buf.find(CLOSE, at + 1)
        return -1
