"""Tool calls read out of model output, incrementally (streamed and whole outputs alike): one
parser per format, all yielding the events of events.py.

`--tool-call-parser NAME` picks the parser of a model's own format (SGLang's names) for tool_choice
`auto`, whose answer then runs unconstrained: hermes / qwen25 (hermes.py), llama3, mistral,
pythonic; each is a CheckedParser (checked.py): a call goes out once it is whole and well formed,
anything else is content. What a grammar writes (tool_choice `required` or a named function, and
`auto` without the flag) is the Hermes envelope, read by ToolCallParser (hermes_stream.py), which
streams arguments as they are generated.

A parser: `feed(text) -> [Event]` per delta, `finish() -> [Event]` at the end; `num_calls` (calls
read) and `in_call` (the output is, or ended, inside a call).
"""

from __future__ import annotations

from typing import Any, Iterable

from radixrt.runtime.serving.openai_api.tool_parsers.checked import CheckedParser
from radixrt.runtime.serving.openai_api.tool_parsers.events import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    Event,
)
from radixrt.runtime.serving.openai_api.tool_parsers.hermes import HermesParser
from radixrt.runtime.serving.openai_api.tool_parsers.hermes_stream import ToolCallParser
from radixrt.runtime.serving.openai_api.tool_parsers.llama3 import Llama3Parser
from radixrt.runtime.serving.openai_api.tool_parsers.mistral import MistralParser
from radixrt.runtime.serving.openai_api.tool_parsers.pythonic import PythonicParser

# --tool-call-parser's choices (config.py lists the same names; a unit test checks they agree)
PARSERS: dict[str, type[CheckedParser]] = {
    "hermes": HermesParser,
    "qwen25": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}

__all__ = [
    "PARSERS",
    "ArgsDelta",
    "CallEnd",
    "CallStart",
    "CheckedParser",
    "Content",
    "Event",
    "HermesParser",
    "Llama3Parser",
    "MistralParser",
    "PythonicParser",
    "ToolCallParser",
    "make_parser",
    "parse_all",
]


def make_parser(name: str, names: Iterable[str] | None = None) -> CheckedParser:
    """The parser `--tool-call-parser name` names; calls to other tools than `names` (when given)
    are content."""
    return PARSERS[name](names)


def parse_all(text: str, parser: Any = None) -> tuple[str, list[tuple[str, str]]]:
    """A whole output -> (content, [(name, arguments JSON text), ...]) through parser (default: a
    ToolCallParser)."""
    parser = ToolCallParser() if parser is None else parser
    content, calls = [], []
    for e in parser.feed(text) + parser.finish():
        if isinstance(e, Content):
            content.append(e.text)
        elif isinstance(e, CallStart):
            calls.append([e.name, ""])
        elif isinstance(e, ArgsDelta):
            calls[e.index][1] += e.text
    return "".join(content), [(name, args) for name, args in calls]
