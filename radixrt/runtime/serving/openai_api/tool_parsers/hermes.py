"""`--tool-call-parser hermes` (also `qwen25`): Hermes / Qwen 2.5 calls in free text,
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several in a row.

A call ends at the first `</tool_call>` outside a JSON string; what it wraps must be one JSON
object with a "name" and its "arguments" (or "parameters"), else the whole tagged text is content.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.serving.openai_api.tool_parsers.checked import CheckedParser
from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    call_from,
    loads_json,
    partial_len,
)
from radixrt.runtime.serving.openai_api.tool_parsers.hermes_stream import CLOSE, OPEN
from radixrt.runtime.serving.openai_api.tool_parsers.scan import TagEnd


class HermesParser(CheckedParser):
    def _find_start(self, buf: str) -> tuple[int, int]:
        at = buf.find(OPEN)
        return (at, 0) if at >= 0 else (-1, partial_len(buf, OPEN))

    def _region_end(self, buf: str) -> int:
        if self.scan is None:
            self.scan = TagEnd(CLOSE, len(OPEN))
        at = self.scan.find(buf)
        return -1 if at < 0 else at + len(CLOSE)

    def _calls(self, region: str) -> list[tuple[Any, Any] | None] | None:
        return [call_from(loads_json(region[len(OPEN) : -len(CLOSE)]))]
