"""The scheduler with a real model and real grammar backends behind it: core/ never imports model/
or constrained/ (both need torch), so they meet here."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.config import ServerConfig


def create_scheduler(config: ServerConfig):
    from radixrt.runtime.constrained.state import fill_masks  # torch is imported here, not before
    from radixrt.runtime.core.scheduler import Scheduler
    from radixrt.runtime.model.model_runner import ModelRunner

    runner = ModelRunner(config, fill_masks=fill_masks)
    return Scheduler(config, runner, grammar_backends(config, runner))


def grammar_backends(config: ServerConfig, runner: Any) -> Any:
    """constrained/choose.py's BackendChooser for the runner's vocabulary; each backend is built
    on the first constraint of its kind."""
    from radixrt.runtime.constrained.choose import BackendChooser, make_backend

    eos = sorted(set(runner.eos_token_ids))

    def make(name: str) -> Any:
        return make_backend(
            name,
            runner.tokenizer,
            runner.vocab_size,
            eos,
            cache_size=config.grammar_cache_size,
            compile_timeout=config.grammar_compile_timeout,
            enable_jump_forward=config.enable_jump_forward,
            compile_workers=config.grammar_compile_workers,
            compile_memory_mb=config.grammar_compile_memory_mb,
            json_schema_strict=config.json_schema_strict,
        )

    return BackendChooser(config.grammar_backend, make)
