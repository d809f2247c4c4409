"""The scheduler with a real model behind it: core/ never imports model/, so the two meet here."""

from __future__ import annotations

from radixrt.runtime.config import ServerConfig


def create_scheduler(config: ServerConfig):
    from radixrt.runtime.core.scheduler import Scheduler
    from radixrt.runtime.model.model_runner import ModelRunner  # torch is imported here, not before

    return Scheduler(config, ModelRunner(config))
