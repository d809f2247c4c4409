"""The llguidance grammar backend (`--grammar-backend llguidance`; PyPI `llguidance`): the same
interface as GrammarBackend (validate, request -> a future of a per-request state; states write mask
rows, accept tokens, say when they end and draft forced tokens), on llguidance's Earley parser
instead of a DFA.

Why a second backend: context-free grammars (`ebnf`, Lark), JSON of any depth for `json_object`, and
llguidance's own JSON-schema compiler. Grammars are built lazily by llguidance, so a matcher is
created in microseconds to milliseconds on a worker thread (a deadline as for outlines compiles);
llguidance bounds its own work per token (its parser limits), so one grammar cannot stall the step.

Spec -> grammar: regex and choices -> its regex grammar (Rust regex syntax, as ours); json_schema
with the whitespace outlines is given ("[ ]?" between tokens) and declared keys only where the
schema is silent (json_schema/strict.py, as outlines and xgrammar's strict mode) and no format names
outside JSON Schema's (json_schema/formats.py: annotations, which llguidance would refuse);
json_object (the internal kind) -> any JSON object with bounded whitespace (the OpenAI routes send
their own depth-bounded Lark grammar as ebnf instead); ebnf (GBNF, SGLang's parameter) and lark ->
its Lark grammar; tool_call_grammar -> the regex of tool_call_regex.py.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from radixrt.runtime.constrained.compile_pool import TransientGrammarError
from radixrt.runtime.constrained.fallback import IntersectMask, Shadow
from radixrt.runtime.constrained.json_schema.formats import without_nonstandard_formats
from radixrt.runtime.constrained.json_schema.strict import declared_keys_only
from radixrt.runtime.constrained.llg_limits import PARSER_LIMITS, fill_mask
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.spec import grammar_key, spec_regex
from radixrt.runtime.constrained.state import EosGate

JSON_SCHEMA_OPTIONS = {"whitespace_flexible": False, "whitespace_pattern": "[ ]?"}
JSON_OBJECT_MAX_WS = 40
JSON_OBJECT_OPTIONS = {
    "whitespace_flexible": False,
    "whitespace_pattern": "[ \\t\\n\\r]{0,%d}" % JSON_OBJECT_MAX_WS,
}
MAX_DRAFT_TOKENS = 16


def available() -> bool:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def grammar_for(key: tuple, strict: bool = True) -> str:
    """The llguidance grammar (its serialized form) of a grammar key; GrammarError if it cannot be
    built. strict: json_schema objects take only their declared keys where the schema is silent."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    kind, spec = key
    try:
        if kind == "json_schema":
            schema = without_nonstandard_formats(json.loads(spec))
            return LLMatcher.grammar_from_json_schema(
                declared_keys_only(schema) if strict else schema, defaults=JSON_SCHEMA_OPTIONS
            )
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=JSON_OBJECT_OPTIONS
            )
        if kind in ("ebnf", "lark"):
            return LLMatcher.grammar_from_lark(any_to_lark(spec))
        return LLMatcher.grammar_from_regex(spec_regex(key))  # regex, choices, tool_call_grammar
    except GrammarError:
        raise
    except Exception as e:  # llguidance's own refusals (ValueError, its parse errors)
        raise GrammarError(f"cannot build the {kind} grammar: {str(e)[:300]}") from None


QUEUED_TIMEOUTS = 8  # a build waits for the builder thread at most this many time limits


class LLGFuture:
    """A grammar being built on the builder thread. Its time limit counts from when the build
    starts (`started` is set then), so builds queued behind others are not failed for the wait;
    a thread cannot be stopped, so a wait behind a runaway build has a bound of its own."""

    def __init__(self, kind: str, future: Future, started: list[float], timeout: float):
        self._kind, self._future, self._started, self._timeout = kind, future, started, timeout
        self._queued_until = time.monotonic() + QUEUED_TIMEOUTS * timeout

    def done(self) -> bool:
        if self._future.done():
            return True
        now = time.monotonic()
        if self._started:
            return now >= self._started[0] + self._timeout
        return now >= self._queued_until

    def result(self) -> "LLGState":
        # the builder was busy or slow: no verdict on the grammar itself
        if not self._future.done():
            raise TransientGrammarError(
                f"building the {self._kind} grammar took longer than {self._timeout:g} s"
            )
        return self._future.result()


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: list[int],
        compile_timeout: float = 10.0,
        enable_jump_forward: bool = True,
        strict: bool = True,
        **_: Any,
    ):
        import llguidance.hf

        self.vocab_size = vocab_size
        self.eos_token_ids = sorted({int(e) for e in eos_token_ids})
        self.compile_timeout = compile_timeout
        self.jump_forward = enable_jump_forward
        self.strict = strict
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.num_words = (max(vocab_size, self.tokenizer.vocab_size) + 31) // 32
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixrt-llg")
        self.limits = llguidance.LLParserLimits(**PARSER_LIMITS)
        self.cached_bytes = 0  # nothing cached: llguidance builds its automata lazily per matcher

    def validate(self, kind: str, spec: Any) -> None:
        from llguidance import LLMatcher

        grammar = grammar_for(grammar_key(kind, spec), self.strict)
        error = LLMatcher.validate_grammar(grammar, self.tokenizer, limits=self.limits)
        if error:
            raise GrammarError(f"invalid {kind}: {str(error)[:300]}")

    def _build(self, kind: str, spec: Any, started: list[float]) -> "LLGState":
        from llguidance import LLMatcher

        started.append(time.monotonic())
        grammar = grammar_for(grammar_key(kind, spec), self.strict)
        matcher = LLMatcher(self.tokenizer, grammar, limits=self.limits)
        if matcher.is_error():
            raise GrammarError(f"invalid {kind}: {matcher.get_error()[:300]}")
        return LLGState(
            matcher, f"{kind} grammar", self.eos_token_ids, self.num_words, self.jump_forward
        )

    def request(self, kind: str, spec: Any) -> LLGFuture:
        started: list[float] = []
        return LLGFuture(
            kind, self._pool.submit(self._build, kind, spec, started), started, self.compile_timeout
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Position:
    """The mask at a draft position (after some forced tokens), computed on a copy of the
    matcher."""

    ended = False

    def __init__(
        self,
        words: np.ndarray,
        accepting: bool,
        stopped: bool,
        eos_token_ids: list[int],
        shadow_state: int | None = None,
    ):
        self.words, self.accepting, self.stopped = words, accepting, stopped
        self.shadow_state = shadow_state  # the outlines shadow's DFA state here (auto), else None
        self.eos_token_ids = eos_token_ids
        self.num_words = words.size

    def write_bits(self, words: torch.Tensor) -> None:
        words.copy_(torch.from_numpy(self.words[: words.numel()]))

    def eos_open(self) -> bool:
        return self.accepting


class LLGState(EosGate):
    """Per-request llguidance matcher. Used only by the scheduler thread."""

    def __init__(
        self,
        matcher: Any,
        description: str,
        eos_token_ids: list[int],
        num_words: int,
        jump_forward: bool,
    ):
        self.matcher = matcher
        self.description = description
        self.eos_token_ids = eos_token_ids
        self.num_words = num_words
        self.jump_forward = jump_forward
        # outlines' DFA of the same grammar, for budget steering (auto)
        self.shadow: Shadow | None = None
        # every pick inside the shadow's language (a grammar's nesting-bounded subset)
        self.confine = False

    def is_final(self) -> bool:
        return self.matcher.is_accepting()

    def fork(self, tokens: list[int]) -> "LLGState":
        """The matcher deep-copied; the outlines shadow (if any) forked along."""
        twin = LLGState(
            self.matcher.deep_copy(),
            self.description,
            self.eos_token_ids,
            self.num_words,
            self.jump_forward,
        )
        twin.confine, twin._eos_accepted = self.confine, self._eos_accepted
        if self.shadow is not None:
            twin.shadow = self.shadow.fork(tokens)
        return twin

    def _write_allowed(self, words: torch.Tensor) -> None:
        fill_mask(self.matcher, words)

    def _advance(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):
            raise GrammarError(f"token {token_id} is not allowed by the {self.description} here")
        if self.shadow is not None:
            self.shadow.accept(token_id)

    def is_terminated(self) -> bool:
        return self._eos_accepted or self.matcher.is_stopped()

    def ends_at(self, position: _Position) -> bool:
        return position.stopped

    def at(self, position: _Position, budget: int) -> Any:
        shadow = self.shadow.state if self.shadow is not None else None
        if shadow is None or position.shadow_state is None:
            return position
        steered = shadow.steered_at(position.shadow_state, budget)
        if steered is None and self.confine:
            from radixrt.runtime.constrained.state import StateMask

            steered = StateMask(shadow.compiled, position.shadow_state, shadow.eos_token_ids)
        return position if steered is None else IntersectMask(position, steered)

    def for_budget(self, budget: int) -> Any:
        """llguidance's Earley parser gives no shortest completion to steer by; under
        --grammar-backend auto an outlines shadow of the same grammar steers (fallback.py), else an
        unfinished request ends marked incomplete."""
        shadow = (
            self.shadow.current() if self.shadow is not None and not self._eos_accepted else None
        )
        if shadow is None:
            return self
        steered = shadow.for_budget(budget)
        return self if steered is shadow and not self.confine else IntersectMask(self, steered)

    def shortest_completion(self) -> int | None:
        """The fewest tokens that complete a match, as the outlines shadow knows it (None
        without one)."""
        shadow = self.shadow.current() if self.shadow is not None else None
        return None if shadow is None else shadow.shortest_completion()

    def follow(self, shadow_future: Any, confine: bool = False) -> None:
        """Steer by the outlines compile of the same grammar once it arrives (fallback.Shadow).
        confine: keep every pick inside the shadow's language, not only near the end of the budget
        (a grammar's shadow is its nesting-bounded subset: output nested deeper could not be steered
        to a close any more)."""
        self.shadow = Shadow(shadow_future)
        self.confine = confine

    def draft(self, max_tokens: int) -> tuple[list[int], list[_Position]]:
        """The tokens the grammar forces from here (llguidance's fast-forward), and the mask after
        each."""
        if (
            not self.jump_forward
            or self._eos_accepted
            or max_tokens <= 0
            or self.matcher.is_stopped()
        ):
            return [], []
        ids = list(self.matcher.compute_ff_tokens())[: min(max_tokens, MAX_DRAFT_TOKENS)]
        if not ids:
            return [], []
        copy = self.matcher.deep_copy()
        shadow = self.shadow.current() if self.shadow is not None else None
        shadow_state = shadow.guide.get_state() if shadow is not None else None
        positions = []
        for i, t in enumerate(ids):
            if not copy.consume_token(t):
                ids = ids[:i]
                break
            words = torch.zeros(self.num_words, dtype=torch.int32)
            if not copy.is_stopped():
                fill_mask(copy, words)
            if shadow_state is not None:  # None once the forced text leaves the shadow's language
                shadow_state = shadow.compiled.index.get_next_state(shadow_state, t)
            positions.append(
                _Position(
                    words.numpy(),
                    copy.is_accepting(),
                    copy.is_stopped(),
                    self.eos_token_ids,
                    shadow_state,
                )
            )
        return ids, positions
