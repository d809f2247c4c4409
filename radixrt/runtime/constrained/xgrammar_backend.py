"""The xgrammar grammar backend (`--grammar-backend xgrammar`, SGLang's name and default; PyPI
`xgrammar`): the same interface as GrammarBackend and LLGuidanceBackend (validate, request -> a
future of a per-request state; states write mask rows, accept tokens, say when they end and draft
forced tokens), on xgrammar's compiled pushdown automaton (token masks precomputed per grammar).

Compiles run in killable worker processes (xgrammar_compile.py through compile_pool.py: bounded in
number, time and memory, niced), never on the event loop or the scheduler loop; the serialized
result is read back on the pool's thread. Compiled grammars are kept in an LRU bounded in entries
(--grammar-cache-size) and bytes (xgrammar's memory_size_bytes). A timeout is a
TransientGrammarError (not cached); a grammar xgrammar cannot read, or a schema whose keywords it
would not enforce, is a GrammarError naming the problem (cached). The first job of each worker may
also wait out its start (importing torch and xgrammar: seconds): START_S on top of the time limit.

Budget steering: xgrammar gives no shortest completion either; choose.py wraps this backend in a
FallbackBackend(shadow=True, fallback=False) so the outlines DFA of the same constraint steers near
the end of the budget, as for llguidance.
"""

from __future__ import annotations

import os
from typing import Any

from radixrt.runtime.constrained.backend import GrammarFuture
from radixrt.runtime.constrained.compile_pool import CompilePool
from radixrt.runtime.constrained.compiled_cache import CompiledCache
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.xgrammar_state import ForcedText, XGrammarState

WORKER = "radixrt.runtime.constrained.xgrammar_compile"
START_S = 30.0  # a worker's imports (torch, xgrammar) on a loaded machine
COMPILE_THREADS = 2  # xgrammar's threads per compile (each worker is one compile at a time)


def available() -> bool:
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        return False
    return True


class XGrammarBackend:
    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: list[int],
        cache_size: int = 256,
        compile_timeout: float = 10.0,
        enable_jump_forward: bool = True,
        compile_workers: int = 1,
        compile_memory_mb: int = 2048,
        cache_bytes: int = 512 << 20,
        index: bool = True,
        strict: bool = True,
        **_: Any,
    ):
        """index False: only validate (the edge's workers get no vocabulary)."""
        import xgrammar as xgr

        if cache_size < 1 or compile_timeout <= 0:
            raise ValueError("cache_size must be >= 1 and compile_timeout > 0")
        self.eos_token_ids = sorted({int(e) for e in eos_token_ids})
        self.compile_timeout = compile_timeout
        self.strict = strict
        # ids past the tokenizer (padded logits) are xgrammar's special tokens: never allowed
        self.info = (
            xgr.TokenizerInfo.from_huggingface(
                tokenizer,
                vocab_size=max(vocab_size, len(tokenizer)),
                stop_token_ids=self.eos_token_ids or None,
            )
            if index
            else None
        )
        self.num_words = (self.info.vocab_size + 31) // 32 if index else 0
        self.forced = (
            ForcedText(tokenizer, [bytes(b) for b in self.info.decoded_vocab])
            if enable_jump_forward and index
            else None
        )
        threads = max(1, min(COMPILE_THREADS, os.cpu_count() or 1))
        setup = (
            self.info.serialize_json() if index else None,
            compile_memory_mb << 20,
            strict,
            threads,
        )
        self.pool = CompilePool(compile_workers, module=WORKER, setup=setup, start_s=START_S)
        self.pool.submit("warm-up", ("warm-up", None), compile_timeout)  # start importing now
        self.compiled = CompiledCache(
            self.pool,
            cache_size,
            cache_bytes,
            compile_timeout,
            self._settle_bound,
            ("check", "compile"),
            self._read,
        )
        self._compiler: Any = None  # compile_in_process's (benchmarks)

    def _settle_bound(self) -> float:
        return self.pool.settle_bound(self.compile_timeout)

    def validate(self, kind: str, spec: Any) -> None:
        """GrammarError unless xgrammar can enforce the spec; blocks the caller for at most the
        pool's bound (call it off an event loop)."""
        self.compiled.validate(kind, spec)

    def request(self, kind: str, spec: Any) -> GrammarFuture:
        return GrammarFuture(self, kind, *self.compiled.request(kind, spec))

    def _read(self, key: tuple, job_result: Any) -> tuple[Any, int]:
        """A finished compile job (on the pool's thread): the compiled grammar read back."""
        import xgrammar as xgr

        result = xgr.CompiledGrammar.deserialize_json(job_result, self.info)
        return result, result.memory_size_bytes

    def new_state(self, compiled: Any) -> XGrammarState:
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=self.eos_token_ids or None)
        return XGrammarState(matcher, "grammar", self.eos_token_ids, self.num_words, self.forced)

    def compile_in_process(self, key: tuple) -> Any:
        """Compile here, unbounded: for benchmarks that time it in a process of their own."""
        import xgrammar as xgr

        from radixrt.runtime.constrained.xgrammar_compile import clean, grammar_for

        if self._compiler is None:
            self._compiler = xgr.GrammarCompiler(
                self.info, max_threads=COMPILE_THREADS, cache_enabled=False
            )
        grammar = grammar_for(key, self.strict, capture=True)
        try:
            return self._compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError) as e:
            raise GrammarError(f"xgrammar cannot compile the {key[0]}: {clean(e)}") from None

    @property
    def cached_bytes(self) -> int:
        return self.compiled.cached_bytes

    def shutdown(self) -> None:
        """Forget cached grammars and stop the compile workers."""
        self.compiled.clear()
        self.pool.shutdown()
