"""Constrained decoding: regex / JSON-schema / choices grammars compiled through outlines-core,
per-request FSM state, batched token masks, and jump-forward drafts.

The rest of the runtime uses only what is exported here.
"""
from radixrt.runtime.constrained.backend import GrammarBackend, GrammarError, fill_masks

__all__ = ["GrammarBackend", "GrammarError", "fill_masks"]
