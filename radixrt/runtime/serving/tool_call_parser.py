"""The former home of the Hermes-envelope parser: it lives in tool_parsers/ (hermes_stream.py);
this path still imports it."""

from radixrt.runtime.serving.tool_parsers import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    Event,
    ToolCallParser,
    parse_all,
)
from radixrt.runtime.serving.tool_parsers.hermes_stream import CLOSE, OPEN

__all__ = [
    "CLOSE",
    "OPEN",
    "ArgsDelta",
    "CallEnd",
    "CallStart",
    "Content",
    "Event",
    "ToolCallParser",
    "parse_all",
]
