"""Which grammar backend serves a constraint: the configured one (--grammar-backend), except that a
context-free grammar (ebnf) always goes to llguidance, the backend that can enforce it; without
llguidance installed such a request is refused with an error naming the package. `auto` is
llguidance with outlines behind it for what llguidance refuses, and outlines steering llguidance's
requests near the end of their budget (fallback.py), for JSON schemas and json_object; for ebnf,
llguidance alone steered by the DFA of the grammar's regular subset (cfg_regex.py); for regexes,
choices and tool-call envelopes it is outlines first with llguidance behind it; without llguidance
installed, outlines. `llguidance` serves every constraint with llguidance alone, steered by the same
outlines shadow (so a budget that admits a valid ending gives one under every backend).

`xgrammar` serves every constraint with xgrammar alone, steered by the same outlines shadow, ebnf
included (xgrammar enforces context-free grammars: GBNF, `root ::= ...`); only an ebnf in Lark
syntax, llguidance's dialect (what structural_tag and the OpenAI json_object grammar are served as,
and a user's Lark grammar), goes to llguidance (ByDialect)."""

from __future__ import annotations

import re
from concurrent.futures import Future
from typing import Any, Callable

from radixrt.runtime.constrained import llg_backend, xgrammar_backend
from radixrt.runtime.constrained.fallback import FallbackBackend
from radixrt.runtime.constrained.reasoning_gate import GatedFuture
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import CFG_KINDS

REGEX_FIRST_KINDS = ("regex", "choices", "tool_call_grammar")
BACKENDS = ("auto", "outlines", "llguidance", "xgrammar")
# llguidance's own test for Lark syntax (llguidance.gbnf_to_lark.is_lark_syntax)
LARK_SYNTAX = re.compile(r"(?m)^\s*(%llguidance\b|start\s*:)")


def make_backend(
    name: str,
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    json_schema_strict: bool = True,
    **options: Any,
) -> Any:
    """json_schema_strict: llguidance's objects take only declared keys (outlines' always do)."""
    if name == "llguidance":
        return llg_backend.LLGuidanceBackend(
            tokenizer, vocab_size, eos_token_ids, strict=json_schema_strict, **options
        )
    if name == "xgrammar":
        return xgrammar_backend.XGrammarBackend(
            tokenizer, vocab_size, eos_token_ids, strict=json_schema_strict, **options
        )
    from radixrt.runtime.constrained.backend import GrammarBackend

    return GrammarBackend(tokenizer, vocab_size, eos_token_ids, **options)


def backends_for(
    config: Any, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], **overrides: Any
) -> BackendChooser:
    """The BackendChooser of a server config (--grammar-backend and the grammar_* knobs) for one
    vocabulary; overrides: backend options that differ (the request edge compiles no index)."""
    options = dict(
        cache_size=config.grammar_cache_size,
        compile_timeout=config.grammar_compile_timeout,
        enable_jump_forward=config.enable_jump_forward,
        compile_workers=config.grammar_compile_workers,
        compile_memory_mb=config.grammar_compile_memory_mb,
        json_schema_strict=config.json_schema_strict,
    )
    options.update(overrides)
    return BackendChooser(
        config.grammar_backend,
        lambda name: make_backend(name, tokenizer, vocab_size, eos_token_ids, **options),
    )


class BackendChooser:
    def __init__(self, configured: str, make: Callable[[str], Any]):
        """make(name) builds the backend of that name ("outlines", "llguidance" or "xgrammar"),
        called once each."""
        if configured not in BACKENDS:
            raise ValueError(
                f"unknown grammar backend {configured!r}: auto, outlines, llguidance or xgrammar"
            )
        if configured == "llguidance" and not llg_backend.available():
            raise ValueError(
                "--grammar-backend llguidance needs the llguidance package: pip install llguidance"
            )
        if configured == "xgrammar" and not xgrammar_backend.available():
            raise ValueError(
                "--grammar-backend xgrammar needs the xgrammar package: pip install xgrammar"
            )
        self.configured = configured
        self._make = make
        self._built: dict[str, Any] = {}
        self._fallbacks: dict[str, FallbackBackend] = {}  # auto's, by the backend asked first

    def for_kind(self, kind: str) -> Any:
        if self.configured == "xgrammar":
            if kind in CFG_KINDS:
                return self._steered("ebnf", ByDialect(self._steered("xgrammar"), self._lark))
            return self._steered("xgrammar")
        name = "llguidance" if kind in CFG_KINDS and self.configured != "auto" else self.configured
        if name == "auto":
            if not llg_backend.available():
                if kind in CFG_KINDS:
                    raise GrammarError(
                        f"{kind} needs the llguidance grammar backend: pip install llguidance"
                    )
                return self._get("outlines")
            # regexes, choices and tool-call envelopes are our own regexes: outlines first (its DFA
            # is the language, steered directly); schemas and context-free grammars: llguidance
            # first, with an outlines DFA as a steering shadow (for a grammar, of its regular
            # subset; no fallback to outlines)
            first = "outlines" if kind in REGEX_FIRST_KINDS else "llguidance"
            if first not in self._fallbacks:
                second = "llguidance" if first == "outlines" else "outlines"
                self._fallbacks[first] = FallbackBackend(
                    self._get(first), self._get(second), shadow=first == "llguidance"
                )
            return self._fallbacks[first]
        if name == "llguidance" and not llg_backend.available():
            raise GrammarError(
                f"{kind} needs the llguidance grammar backend: pip install llguidance"
            )
        if name == "llguidance":
            # llguidance serves alone, but its parser gives no shortest completion: an outlines DFA
            # of the same constraint (of a grammar's regular subset) steers it near the end of the
            # budget, as under auto
            if "steered" not in self._fallbacks:
                self._fallbacks["steered"] = FallbackBackend(
                    self._get("llguidance"), self._get("outlines"), shadow=True, fallback=False
                )
            return self._fallbacks["steered"]
        return self._get(name)

    def _steered(self, name: str, built: Any = None) -> Any:
        """The backend `name` alone, an outlines DFA of the same constraint steering it near the end
        of the budget (xgrammar's automaton, like llguidance's parser, gives no shortest
        completion); built: an already steered backend to remember under that name."""
        if name not in self._fallbacks:
            self._fallbacks[name] = built or FallbackBackend(
                self._get(name), self._get("outlines"), shadow=True, fallback=False
            )
        return self._fallbacks[name]

    def _lark(self) -> Any:
        if not llg_backend.available():
            raise GrammarError(
                "a Lark grammar needs the llguidance backend: pip install llguidance"
            )
        return self._steered("llguidance")

    def _get(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = self._make(name)
        return self._built[name]

    def built(self) -> list[Any]:
        return list(self._built.values())

    @staticmethod
    def after_reasoning(future: Any, end_ids: tuple[int, ...]) -> Any:
        """The grammar of `future` held back until the thinking ends (reasoning_gate.py)."""
        return GatedFuture(future, list(end_ids))


class ByDialect:
    """ebnf under --grammar-backend xgrammar: a GBNF grammar to xgrammar (steered), a Lark grammar
    (llguidance's dialect: structural_tag's and json_object's grammars use its extensions) to
    llguidance (steered), built on first use."""

    name = "xgrammar"

    def __init__(self, gbnf: Any, lark: Callable[[], Any]):
        self._gbnf, self._lark = gbnf, lark

    def _for(self, spec: Any) -> Any:
        lark = isinstance(spec, str) and LARK_SYNTAX.search(spec) is not None
        return self._lark() if lark else self._gbnf

    def validate(self, kind: str, spec: Any) -> None:
        self._for(spec).validate(kind, spec)

    def request(self, kind: str, spec: Any) -> Any:
        try:
            return self._for(spec).request(kind, spec)
        except GrammarError as e:  # no llguidance: this request's failure, reported as a compile's
            failed: Future = Future()
            failed.set_exception(e)
            return failed

    @property
    def cached_bytes(self) -> int:
        return self._gbnf.cached_bytes

    def shutdown(self) -> None:
        self._gbnf.shutdown()
