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
    kv_transfer = None
    if config.disaggregation_mode != "null":
        from radixrt.runtime.disaggregation.transfer import make_transfer

        try:
            kv_transfer = make_transfer(config, runner)
        except Exception:
            runner.close()
            raise
    return Scheduler(config, runner, grammar_backends(config, runner), kv_transfer)


def grammar_backends(config: ServerConfig, runner: Any) -> Any:
    """constrained/choose.py's BackendChooser for the runner's vocabulary; each backend is built
    on the first constraint of its kind."""
    from radixrt.runtime.constrained.choose import backends_for

    eos = sorted(set(runner.eos_token_ids))
    return backends_for(config, runner.tokenizer, runner.vocab_size, eos)
