"""What a tool-call parser yields, and the small readers every format shares.

Events, in the order the text produced them: `Content` fragments, and per call `CallStart(index,
name)`, argument fragments (`ArgsDelta`) that concatenate to the arguments' JSON text, and
`CallEnd(index)`. Feeding a parser the text in any split yields the same events up to how content
and arguments are cut into fragments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int


Event = Content | CallStart | ArgsDelta | CallEnd


def partial_len(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (it may still become
    tag)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json(text: str) -> Any:
    """Strict JSON (no NaN or Infinity), or None where text is not JSON."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None


def call_from(obj: Any) -> tuple[Any, Any] | None:
    """{"name": ..., "arguments" (or "parameters"): {...}} -> (name, arguments), unchecked; None
    where obj is no such object. Missing arguments are {} (as SGLang reads them)."""
    if not isinstance(obj, dict) or "name" not in obj:
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    return obj["name"], args
