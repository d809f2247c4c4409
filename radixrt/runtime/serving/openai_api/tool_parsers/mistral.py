"""`--tool-call-parser mistral`: Mistral calls in free text. `[TOOL_CALLS]` then a JSON array of
`{"name": ..., "arguments": {...}}` (a single object is read too), or the newer tokenizers'
`[TOOL_CALLS]NAME[ARGS]{...}` (one call per tag). `[TOOL_CALLS]` is a special token, which
skip_special_tokens (the default) drops from the text: a bare array of calls at the start of the
output is read as calls as well. Text before the tag is content; so is a tagged text that is not
calls.
"""

from __future__ import annotations

import re
from typing import Any

from radixrt.runtime.serving.openai_api.tool_parsers.checked import CheckedParser
from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    call_from,
    loads_json,
    partial_len,
)
from radixrt.runtime.serving.openai_api.tool_parsers.scan import ValueEnd

TAG = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_WS = re.compile(r"\s*")
_BARE = re.compile(r"\s*(\[)\s*\{")  # an array of objects opens the output (the tag dropped)
_BARE_SO_FAR = re.compile(r"\s*(?:\[\s*)?\Z")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_NAMED = re.compile(r"([A-Za-z0-9_.-]+)\[ARGS\](.*)\Z", re.S)


class MistralParser(CheckedParser):
    def _find_start(self, buf: str) -> tuple[int, int]:
        if self.fresh and not self.num_calls:
            bare = _BARE.match(buf)
            if bare:
                return bare.start(1), 0
            if _BARE_SO_FAR.match(buf):
                return -1, len(buf)
        at = buf.find(TAG)
        return (at, 0) if at >= 0 else (-1, partial_len(buf, TAG))

    def _region_end(self, buf: str) -> int:
        if self.scan is None:
            start = self._value_start(buf)
            if start < 0:
                return -1 if start == -1 else len(TAG)  # -2: the tag without a call: content
            self.scan = ValueEnd(start)
        return self.scan.find(buf)

    @staticmethod
    def _value_start(buf: str) -> int:
        """Where the region's JSON value opens; -1: not known yet; -2: it has none."""
        head = len(TAG) if buf.startswith(TAG) else 0
        lead = _WS.match(buf, head).end()
        if lead == len(buf):
            return -1
        if buf[lead] in "[{":
            return lead
        name = _NAME.match(buf, head)
        rest = buf[name.end() :] if name else None
        if rest is None or not (rest.startswith(ARGS) or ARGS.startswith(rest)):
            return -2
        if len(rest) <= len(ARGS):
            return -1
        lead = _WS.match(buf, name.end() + len(ARGS)).end()
        if lead == len(buf):
            return -1
        return lead if buf[lead] == "{" else -2

    def _calls(self, region: str) -> list[tuple[Any, Any] | None] | None:
        body = region[len(TAG) :] if region.startswith(TAG) else region
        named = _NAMED.match(body)
        if named:
            return [(named.group(1), loads_json(named.group(2)))]
        value = loads_json(body)
        if isinstance(value, dict):
            return [call_from(value)]
        return [call_from(v) for v in value] if isinstance(value, list) else None
