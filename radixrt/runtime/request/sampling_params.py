"""Per-request sampling parameters (SGLang names), validated once at the edge.

The dataclass and its reading of a request dict. Which parameters exist is in
sampling_param_names.py, their bounds and checks in sampling_param_checks.py (import them from
there).

Every bad value raises ValueError naming the parameter, so the HTTP layer can turn it
into a 400 and the Engine into an exception, and the scheduler never sees it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.request.sampling_param_checks import validate_sampling_params
from radixrt.runtime.request.sampling_param_names import (
    RADIXRT_SAMPLING_PARAMS,
    SGLANG_SAMPLING_PARAMS,
)

MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    # SGLang's: the output stops once its text matches one of these (searched as it grows; the match
    # stays in the text, finish reason {"type": "stop", "matched": pattern}); stop_regex.py runs
    # them
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # passed to the tokenizer's decode (slow tokenizers use it)
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False  # keep the matched stop string at the end of the text
    # a stream sends a chunk every this many tokens (None: every token)
    stream_interval: int | None = None
    # SGLang's input to a custom logit processor; radixrt has none
    custom_params: dict[str, Any] | None = None
    seed: int | None = None  # SGLang calls it sampling_seed (accepted as that too)
    n: int = 1  # with beam_width > 1: the beams returned (by default all of them)
    beam_width: int | None = None  # > 1: beam search (core/beam_search.py), not sampling
    length_penalty: float = 1.0  # beam search: score = sum of logprobs / length ** length_penalty
    early_stopping: bool | str = False  # beam search: True, False or "never", as transformers'
    structural_tag: str | None = None
    watermark: Any = None
    # constrained decoding: at most one of these
    regex: str | None = None
    json_schema: str | None = None  # a JSON string, as SGLang takes it
    choices: list[str] | None = None
    # radixrt's: tool calls in the fallback format (constrained/tool_call_regex.py); the OpenAI chat
    # route sets it for tools with tool_choice required / a named function / auto once a call is
    # opened
    tool_call_grammar: str | None = None
    # SGLang's: a context-free grammar (GBNF `root ::= ...`, or Lark); llguidance enforces it
    ebnf: str | None = None
    # OpenAI's / SGLang's: token id (a decimal string, as JSON keys are) -> added to that token's
    # logit
    logit_bias: dict[str, float] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        d = dict(d or {})
        unknown = sorted(set(d) - set(SGLANG_SAMPLING_PARAMS) - set(RADIXRT_SAMPLING_PARAMS))
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        if "sampling_seed" in d:
            seed = d.pop("sampling_seed")
            if d.get("seed") is not None and seed is not None and d["seed"] != seed:
                raise ValueError("sampling parameters seed and sampling_seed disagree; give one")
            if d.get("seed") is None:
                d["seed"] = seed
        for name in ("stop", "stop_regex"):  # a string or a list of strings
            if isinstance(d.get(name), str):
                d[name] = [d[name]]
            if d.get(name) is None:
                d.pop(name, None)
        if d.get("stop_token_ids") is None:
            d.pop("stop_token_ids", None)
        # ids as ints (the Engine) or strings (JSON) alike
        if isinstance(d.get("logit_bias"), dict):
            d["logit_bias"] = {
                str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v
                for k, v in d["logit_bias"].items()
            }
        if d.get("beam_width") not in (None, 1) and d.get("n") is None:
            d["n"] = d["beam_width"]  # a beam search returns all its beams unless n says fewer
        p = cls(**d)
        p.validate()
        return p

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def logit_bias_pairs(self) -> list[tuple[int, float]]:
        return [(int(k), float(v)) for k, v in (self.logit_bias or {}).items()]

    @property
    def is_beam(self) -> bool:
        """Beam search (validated: beam_width is an int)."""
        return self.beam_width is not None and self.beam_width > 1

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        """Raise ValueError naming the first bad parameter (checks: sampling_param_checks.py)."""
        validate_sampling_params(self)
