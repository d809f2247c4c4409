"""Which sampling parameters exist: SGLang's /generate list, radixrt's additions beside it,
the SGLang ones radixrt refuses by name until it has the feature, and the constraint fields."""

from __future__ import annotations

# SGLang's /generate sampling parameters (sglang 0.5.23, srt/sampling/sampling_params.py), the one
# list of them: every one is accepted here; those radixrt cannot honour yet are refused by name in
# validate() (NOT_YET).
SGLANG_SAMPLING_PARAMS = (
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "n",
    "beam_width",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "watermark",
)
# radixrt's own (and OpenAI's `seed`; transformers' beam search options), beside SGLang's
RADIXRT_SAMPLING_PARAMS = (
    "seed",
    "choices",
    "tool_call_grammar",
    "length_penalty",
    "early_stopping",
)
# SGLang parameters whose feature radixrt lacks: accepted at their "off" value, refused by name
# otherwise
NOT_YET = {"watermark": "watermarking"}
# constrained decoding, at most one per request; a structural_tag is served as the ebnf grammar it
# becomes (request/structural_tag.py)
CONSTRAINT_FIELDS = (
    "regex",
    "json_schema",
    "choices",
    "tool_call_grammar",
    "ebnf",
    "structural_tag",
)
