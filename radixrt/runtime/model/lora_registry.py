"""The runner's adapters: every loaded adapter's weights in host memory (by name), the slot pool a
forward reads (lora_pool.py), and per forward the slots its items name, filled first when a slot
held another adapter.

A run-time load is two calls: read() (the files, on any thread: it touches no state here; the
scheduler process runs it on a worker thread, serving/backend/lora_loads.py) and install() (on the
scheduler's thread). What read() may open is lora_paths.py's rule."""

from __future__ import annotations

import logging

import torch

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.config_checks import LORA_TARGETS
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.lora_adapter import (
    LoraAdapter,
    LoraError,
    TargetDims,
    load_adapter,
    parse_lora_path,
)
from radixrt.runtime.model.lora_paths import LoraPaths, LoraRefused
from radixrt.runtime.model.lora_pool import LoraPool, LoraStep

log = logging.getLogger(__name__)

DEFAULT_MAX_RANK = 16


class LoraRegistry:
    def __init__(self, config: ServerConfig, model, device: torch.device):
        m = model
        if not m.supports_lora:
            raise ValueError(f"LoRA adapters are not supported for {type(m).__name__} models yet")
        self.dims = TargetDims.llama(
            m.hidden_size,
            m.num_q_heads * m.head_dim,
            m.num_kv_heads * m.head_dim,
            m.intermediate_size,
            m.num_layers,
        )
        self.targets = tuple(config.lora_target_modules or LORA_TARGETS)
        self.adapters: dict[str, LoraAdapter] = {}
        specs = [parse_lora_path(p) for p in config.lora_paths or ()]
        # read first at any rank, so the default max rank is the largest of them
        first = [load_adapter(n, p, self.dims, 1 << 20, self.targets) for n, p in specs]
        self.max_rank = config.max_lora_rank or max(
            [a.rank for a in first], default=DEFAULT_MAX_RANK
        )
        for adapter in first:
            self._add(adapter)
        self.paths = LoraPaths(config.lora_dir or (), [p for _, p in specs])
        self.pool = LoraPool(
            self.dims, config.max_loras_per_batch, self.max_rank, model.dtype, device
        )
        self.device = device

    def _add(self, adapter: LoraAdapter) -> None:
        if adapter.rank > self.max_rank:
            raise LoraError(
                f"LoRA adapter {adapter.name!r} has rank {adapter.rank}, above --max-lora-rank "
                f"{self.max_rank}"
            )
        if adapter.name in self.adapters:
            raise LoraError(f"a LoRA adapter named {adapter.name!r} is already loaded")
        self.adapters[adapter.name] = adapter
        log.info(
            "LoRA adapter %s: rank %d, %s", adapter.name, adapter.rank, sorted(adapter.targets)
        )

    def read(self, name: str, path: str) -> LoraAdapter:
        """The adapter at path, read and checked (any thread). Every refusal is LoraRefused, one
        text whatever the reason; the reason is logged."""
        try:
            real = self.paths.check(path)
            return load_adapter(name, real, self.dims, self.max_rank, self.targets)
        except LoraRefused as e:
            detail = e.detail
        except LoraError as e:
            detail = str(e)
        except Exception as e:  # a reader's own error (safetensors, torch, OSError) names files
            detail = f"{type(e).__name__}: {e}"
        log.warning("LoRA adapter %r from %r refused: %s", name, path, detail)
        raise LoraRefused(detail)

    def install(self, adapter: LoraAdapter) -> None:
        """Serve a read() adapter as its name from now on (LoraError: the name is taken)."""
        self._add(adapter)

    def unload(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise LoraError(f"no LoRA adapter named {name!r} is loaded")
        self.pool.clear(name)

    def step(self, plan: list[PlanItem]) -> LoraStep | None:
        """The forward's LoRA rows, each named slot holding its adapter (copied in if not)."""
        slots = [it.lora_slot for it in plan]
        if all(s is None for s in slots):
            return None
        for it in plan:
            if it.lora_slot is not None and self.pool.names[it.lora_slot] != it.lora:
                self.pool.load(it.lora_slot, self.adapters[it.lora])
        lengths = [len(it.new_ids) for it in plan]
        return LoraStep.for_items(self.pool, slots, lengths, self.device)
