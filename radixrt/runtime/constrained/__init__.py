"""Constrained decoding: regex / JSON-schema / choices grammars compiled through outlines-core,
per-request FSM state, batched token masks, and jump-forward drafts.

The rest of the runtime uses only what is exported here. Exports load lazily, so that the compile
workers (compile_pool.py) can import the torch-free spec -> regex modules without torch.
"""

from typing import Any

__all__ = ["GrammarBackend", "GrammarError", "fill_masks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from radixrt.runtime.constrained import backend

        return getattr(backend, name)
    raise AttributeError(name)
