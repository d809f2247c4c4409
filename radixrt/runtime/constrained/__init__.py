"""Constrained decoding: regex / JSON-schema / choices grammars compiled through outlines-core,
per-request FSM state, batched token masks, and jump-forward drafts.

The exports below load lazily, so that the compile workers (compile_pool.py) can import the
torch-free spec -> regex modules without torch. Beyond them the runtime uses choose.py (the
backend per constraint kind), state.fill_masks, structural_tag.py and tool_call_regex.py.
"""

from typing import Any

__all__ = ["GrammarBackend", "GrammarError", "fill_masks"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from radixrt.runtime.constrained import backend

        return getattr(backend, name)
    raise AttributeError(name)
