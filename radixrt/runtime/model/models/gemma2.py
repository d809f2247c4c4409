"""Gemma 2: gemma_model.py's family with no q/k norms, one RoPE base for every layer, sliding and
global layers alternating, attention scores and final logits soft-capped (50 and 30 in the
released models)."""

from __future__ import annotations

from radixrt.runtime.model.models.gemma_model import GemmaFamilyForCausalLM


class Gemma2ForCausalLM(GemmaFamilyForCausalLM):
    pass
