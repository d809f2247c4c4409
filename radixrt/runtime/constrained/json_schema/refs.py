"""Local $ref resolution: the Resolver finds, within one schema document, the node a reference
names (#, #/json/pointer, #anchor, or an $id), relative to the document's own $id. Remote schemas
are never fetched."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.constrained.regex_builder import GrammarError


class Resolver:
    """Resolves local references (#, #/json/pointer, #anchor, $id names) within one document."""

    def __init__(self, root: Any):
        self.root = root
        self.ids: dict[str, Any] = {}
        base = root.get("$id", root.get("id")) if isinstance(root, dict) else None
        self.base = base.split("#")[0] if isinstance(base, str) else ""
        self._collect(root)

    def _collect(self, node: Any) -> None:
        if isinstance(node, dict):
            for key in ("$id", "id", "$anchor"):
                name = node.get(key)
                if isinstance(name, str):
                    self.ids.setdefault(name if key != "$anchor" else "#" + name, node)
            for k, v in node.items():
                if k not in ("enum", "const", "default", "examples"):
                    self._collect(v)
        elif isinstance(node, list):
            for v in node:
                self._collect(v)

    def resolve(self, ref: str) -> Any:
        if not isinstance(ref, str):
            raise GrammarError(f"$ref must be a string, got {ref!r}")
        if self.base and ref.startswith(self.base):
            ref = ref[len(self.base) :] or "#"
        if ref in self.ids:
            return self.ids[ref]
        if not ref.startswith("#"):
            raise GrammarError(
                f"$ref {ref!r} is not a local reference (remote schemas are not fetched)"
            )
        node = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise GrammarError(f"$ref {ref!r} does not resolve")
        return node
