"""Which grammar backend serves a constraint: the configured one (--grammar-backend), except that a
context-free grammar (ebnf) always goes to llguidance, the backend that can enforce it; without llguidance
installed such a request is refused with an error naming the package. `auto` is llguidance with outlines
behind it for what llguidance refuses, and outlines steering llguidance's requests near the end of their budget
(fallback.py); without llguidance installed, outlines."""
from __future__ import annotations

from typing import Any, Callable

from radixrt.runtime.constrained import llg_backend
from radixrt.runtime.constrained.fallback import FallbackBackend
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import CFG_KINDS


def make_backend(name: str, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], json_schema_strict: bool = True,
                 **options: Any) -> Any:
    """json_schema_strict: llguidance's objects take only declared keys (outlines' always do)."""
    if name == "llguidance":
        return llg_backend.LLGuidanceBackend(tokenizer, vocab_size, eos_token_ids, strict=json_schema_strict,
                                             **options)
    from radixrt.runtime.constrained.backend import GrammarBackend
    return GrammarBackend(tokenizer, vocab_size, eos_token_ids, **options)


class BackendChooser:
    def __init__(self, configured: str, make: Callable[[str], Any]):
        """make(name) builds the backend of that name ("outlines" or "llguidance"), called once each."""
        if configured not in ("auto", "outlines", "llguidance"):
            raise ValueError(f"unknown grammar backend {configured!r}: auto, outlines or llguidance")
        if configured == "llguidance" and not llg_backend.available():
            raise ValueError("--grammar-backend llguidance needs the llguidance package: pip install llguidance")
        self.configured = configured
        self._make = make
        self._built: dict[str, Any] = {}
        self._fallback: FallbackBackend | None = None

    def for_kind(self, kind: str) -> Any:
        name = "llguidance" if kind in CFG_KINDS else self.configured
        if name == "auto":
            if not llg_backend.available():
                return self._get("outlines")
            if self._fallback is None:
                self._fallback = FallbackBackend(self._get("llguidance"), self._get("outlines"), shadow=True)
            return self._fallback
        if name == "llguidance" and not llg_backend.available():
            raise GrammarError(f"{kind} needs the llguidance grammar backend: pip install llguidance")
        return self._get(name)

    def _get(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._make(name)
        return self._built[name]

    def built(self) -> list[Any]:
        return list(self._built.values())
