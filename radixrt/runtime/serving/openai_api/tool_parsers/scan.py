"""Where a call's text ends, found incrementally: each finder is handed the same growing text at
every feed and resumes where it stopped, so a call's text is scanned once whatever its split."""

from __future__ import annotations

_OPENERS = {"[": "]", "{": "}", "(": ")"}
_CLOSERS = frozenset(_OPENERS.values())


class ValueEnd:
    """The end of a bracketed value that opens at text[start] (a JSON object or array; with python,
    a Python list): brackets counted outside strings (JSON's double quotes; Python's single, double
    and triple quotes)."""

    def __init__(self, start: int, python: bool = False):
        self.pos = start
        self.depth = 0
        self.quote = ""  # the delimiter of the string the scan is in ("" outside one)
        self.python = python

    def find(self, text: str) -> int:
        """The index just past the closing bracket, or -1 while the text does not reach it yet."""
        i, n = self.pos, len(text)
        while i < n:
            c = text[i]
            if self.quote:
                step = self._in_string(text, i)
                if step == 0:
                    break
                i += step
            elif c == '"' or (self.python and c == "'"):
                if self.python and n - i < 3 and (c * 3).startswith(text[i:]):
                    break  # a triple quote or not: the next characters say
                self.quote = c * 3 if self.python and text.startswith(c * 3, i) else c
                i += len(self.quote)
            elif c in _OPENERS and (self.python or c != "("):
                self.depth += 1
                i += 1
            elif c in _CLOSERS and (self.python or c != ")"):
                self.depth -= 1
                i += 1
                if self.depth <= 0:
                    self.pos = i
                    return i
            else:
                i += 1
        self.pos = i
        return -1

    def _in_string(self, text: str, i: int) -> int:
        """How far to step inside a string at text[i]; 0: wait for more text."""
        if text[i] == "\\":
            return 2 if i + 1 < len(text) else 0
        if text.startswith(self.quote, i):
            step, self.quote = len(self.quote), ""
            return step
        if len(self.quote) == 3 and self.quote.startswith(text[i:]):
            return 0  # maybe the closing triple quote
        return 1


class TagEnd:
    """The first `tag` from text[start] on that is outside a JSON string (a string argument may
    contain the tag itself)."""

    def __init__(self, tag: str, start: int):
        self.tag = tag
        self.pos = start
        self.in_string = False

    def find(self, text: str) -> int:
        """Where the tag starts, or -1 while the text does not reach it yet."""
        i, n = self.pos, len(text)
        while i < n:
            c = text[i]
            if self.in_string and c == "\\":
                if i + 1 >= n:
                    break
                i += 2
                continue
            if c == '"':
                self.in_string = not self.in_string
            elif not self.in_string and c == self.tag[0]:
                if text.startswith(self.tag, i):
                    self.pos = i
                    return i
                if self.tag.startswith(text[i:]):
                    break  # maybe the tag: wait
            i += 1
        self.pos = i
        return -1
