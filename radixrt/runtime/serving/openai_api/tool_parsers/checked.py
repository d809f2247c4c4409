"""The shared reading of unconstrained model output: content with call regions in it.

A format (hermes.py, llama3.py, mistral.py, pythonic.py) says where a region may start
(`_find_start`), where it ends (`_region_end`) and which calls it holds (`_calls`). Content streams
out as it comes, held back only while it may still be the start of a region. A region is held whole
until it ends; then its calls go out at once (CallStart, the arguments as one JSON fragment,
CallEnd), each checked: a name (one of `names` when given) and arguments that are a JSON object.
A region that is not that (broken JSON, an unknown tool, a Python expression that is not a
literal) is content, as SGLang leaves it: never an error. Separators after a call (whitespace; the
format's `SEP`) are not content. Decisions depend only on the text so far, never on where it was
cut, so every split of a text gives the same events.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    Event,
)


class CheckedParser:
    SEP = re.compile(r"\s*")  # what may separate two calls (not content after a call)

    def __init__(self, names: Iterable[str] | None = None) -> None:
        self.names = None if names is None else frozenset(names)
        self.buf = ""  # text not yet turned into events; in a region it starts at the region
        self.in_call = False  # inside a region (after finish: the output ended inside one)
        self.num_calls = 0
        self.fresh = True  # nothing but separators read since the output's start or the last call
        self.scan: Any = None  # the open region's end finder (scan.py), made by the format

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while True:
            before = (len(self.buf), self.in_call)
            events += self._region_step() if self.in_call else self._content_step()
            if (len(self.buf), self.in_call) == before:
                return events

    def finish(self) -> list[Event]:
        """End of output: held text and an unfinished region are content (separators after the
        last call are not)."""
        text, self.buf = self.buf, ""
        return self._content(text)

    # per format
    def _find_start(self, buf: str) -> tuple[int, int]:
        """(where the first region starts or -1, how many characters at the end to hold back
        because a region may still start in them)."""
        raise NotImplementedError

    def _region_end(self, buf: str) -> int:
        """buf starts at a region: the index just past its end, or -1 while not there yet."""
        raise NotImplementedError

    def _calls(self, region: str) -> list[tuple[Any, Any] | None] | None:
        """The region's (name, arguments) pairs, unchecked; None (or a None pair) when it holds
        none."""
        raise NotImplementedError

    def _content_step(self) -> list[Event]:
        at, hold = self._find_start(self.buf)
        opens = at >= 0
        if not opens:
            at = len(self.buf) - hold
            if self.num_calls and self.fresh and self.SEP.fullmatch(self.buf[:at]):
                return []  # may only separate this call from the next: held
        text, self.buf = self.buf[:at], self.buf[at:]
        if opens:
            self.in_call, self.scan = True, None
        return self._content(text)

    def _region_step(self) -> list[Event]:
        end = self._region_end(self.buf)
        if end < 0:
            return []
        region, self.buf = self.buf[:end], self.buf[end:]
        self.in_call = False
        calls = self._checked(self._calls(region))
        if calls is None:
            return self._content(region)
        events: list[Event] = []
        for name, args in calls:
            index = self.num_calls
            events += [CallStart(index, name), ArgsDelta(index, args), CallEnd(index)]
            self.num_calls += 1
        self.fresh = True
        return events

    def _content(self, text: str) -> list[Event]:
        if not text or (self.num_calls and self.fresh and self.SEP.fullmatch(text)):
            return []
        if not self.SEP.fullmatch(text):
            self.fresh = False
        return [Content(text)]

    def _checked(self, calls: list[tuple[Any, Any] | None] | None) -> list[tuple[str, str]] | None:
        """(name, arguments JSON) per call, or None unless every call is well formed."""
        if not calls:
            return None
        out = []
        for call in calls:
            if call is None:
                return None
            name, args = call
            if not isinstance(name, str) or not name or not isinstance(args, dict):
                return None
            if self.names is not None and name not in self.names:
                return None
            try:
                out.append((name, json.dumps(args, ensure_ascii=False, allow_nan=False)))
            except (ValueError, TypeError, RecursionError):
                return None
        return out
