"""`--tool-call-parser pythonic`: calls as a Python list of calls, `[get_weather(city="Paris"),
add(a=1, b=2)]` (Llama 3.2 / 3.3 / 4 with a pythonic template). The list is read with `ast.parse`,
never evaluated: each call must be a plain name with keyword arguments whose values are literals
(strings, numbers, True/False/None or true/false/null, lists, tuples, dicts with string keys),
emitted as JSON. Anything else (a positional argument, a call or name as a value, a set, bytes)
leaves the whole list as content; text around the list is content.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from radixrt.runtime.serving.openai_api.tool_parsers.checked import CheckedParser
from radixrt.runtime.serving.openai_api.tool_parsers.scan import ValueEnd

_OPEN = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")  # a list whose first item is a call
_OPEN_SO_FAR = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*)?\Z")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class NotLiteral(ValueError):
    pass


class PythonicParser(CheckedParser):
    def _find_start(self, buf: str) -> tuple[int, int]:
        at = buf.find("[")
        while at >= 0:
            if _OPEN.match(buf, at):
                return at, 0
            if _OPEN_SO_FAR.match(buf, at):
                return -1, len(buf) - at
            at = buf.find("[", at + 1)
        return -1, 0

    def _region_end(self, buf: str) -> int:
        if self.scan is None:
            self.scan = ValueEnd(0, python=True)
        return self.scan.find(buf)

    def _calls(self, region: str) -> list[tuple[Any, Any] | None] | None:
        try:
            tree = ast.parse(region, mode="eval").body
            if not isinstance(tree, ast.List):
                return None
            return [_call(item) for item in tree.elts]
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            return None


def _call(node: ast.expr) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if any(kw.arg is None for kw in node.keywords):  # **kwargs
        return None
    return node.func.id, {kw.arg: literal(kw.value) for kw in node.keywords}


def literal(node: ast.expr) -> Any:
    """A literal's value, for JSON; NotLiteral for anything else (nothing is evaluated)."""
    if isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, (str, bool, int, float))
    ):
        return node.value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        keys = [literal(k) if k is not None else None for k in node.keys]
        if not all(isinstance(k, str) for k in keys):
            raise NotLiteral("dict keys must be strings")
        return dict(zip(keys, (literal(v) for v in node.values)))
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    ):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    raise NotLiteral(f"not a literal: {type(node).__name__}")
