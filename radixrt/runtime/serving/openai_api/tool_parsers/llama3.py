"""`--tool-call-parser llama3`: Llama 3.1-3.3 JSON tool calls in free text. A call is one JSON
object `{"name": ..., "parameters": {...}}` ("arguments" is read too) at the start of the output
or after `<|python_tag|>`; several follow one another separated by `;`. Text that is not a call is
content: a call is looked for only at the output's start, right after a call, and after the tag
(which is a special token: skip_special_tokens, the default, drops it, so the object then starts
the output).
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

TAG = "<|python_tag|>"
_WS = re.compile(r"\s*")


class Llama3Parser(CheckedParser):
    SEP = re.compile(r"\s*;?\s*")

    def _find_start(self, buf: str) -> tuple[int, int]:
        if self.fresh:  # an object may start here, after whitespace (or a call's `;`)
            lead = (self.SEP if self.num_calls else _WS).match(buf).end()
            if lead == len(buf):
                return -1, len(buf)
            if buf[lead] == "{":
                return lead, 0
        at = buf.find(TAG)
        return (at, 0) if at >= 0 else (-1, partial_len(buf, TAG))

    def _region_end(self, buf: str) -> int:
        if self.scan is None:
            lead = _WS.match(buf, len(TAG) if buf.startswith(TAG) else 0).end()
            if lead == len(buf):
                return -1
            if buf[lead] != "{":
                return lead  # the tag without a call (Llama's code interpreter): content
            self.scan = ValueEnd(lead)
        return self.scan.find(buf)

    def _calls(self, region: str) -> list[tuple[Any, Any] | None] | None:
        body = region[len(TAG) :] if region.startswith(TAG) else region
        return [call_from(loads_json(body))] if body.strip() else None
