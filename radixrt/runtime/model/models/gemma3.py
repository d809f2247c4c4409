"""Gemma 3 (the text model, Gemma3ForCausalLM): gemma_model.py's family with per-head q/k norms,
five sliding layers to each global one, a RoPE base of its own for the sliding layers
(rope_parameters per layer type) and no soft-capping in the released models. The multimodal
Gemma3ForConditionalGeneration is not served."""

from __future__ import annotations

from radixrt.runtime.model.models.gemma_model import GemmaFamilyForCausalLM


class Gemma3ForCausalLM(GemmaFamilyForCausalLM):
    pass
