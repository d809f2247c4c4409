"""Per-request sampling parameters (SGLang names), validated once at the edge.

Every bad value raises ValueError naming the parameter, so the HTTP layer can turn it
into a 400 and the Engine into an exception, and the scheduler never sees it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_N = 16
MAX_TOP_LOGPROBS = 20
# Bounds a single request cannot exceed (each refusal names the parameter). Large enough for any real
# use, small enough that no value costs the scheduler more than a request's own work.
MAX_INT = 2**31 - 1  # counts and ids: beyond this nothing is meaningful (and orjson stays safe)
MIN_TEMPERATURE = 1e-3  # 0 is greedy; (0, 1e-3) would overflow logits / T into inf and NaN
MIN_REPETITION_PENALTY = 1e-2  # logit / penalty stays finite
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_REGEX_CHARS = 16 * 1024
MAX_JSON_SCHEMA_CHARS = 64 * 1024
MAX_STOP_REGEX = 16
MAX_CUSTOM_PARAMS_KEYS = 64
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024


MAX_LOGIT_BIAS = 300  # OpenAI's limit
_TOKEN_ID_KEY = re.compile(
    r"0|[1-9][0-9]{0,8}"
)  # ASCII digits, no leading zero: one key per token id
# at most one per request; a structural_tag is served as the ebnf grammar it becomes (constrained/structural_tag.py)
CONSTRAINT_FIELDS = (
    "regex",
    "json_schema",
    "choices",
    "tool_call_grammar",
    "ebnf",
    "structural_tag",
)

# SGLang's /generate sampling parameters (sglang 0.5.23, srt/sampling/sampling_params.py), the one list of them:
# every one is accepted here; those radixrt cannot honour yet are refused by name in validate() (NOT_YET).
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
# radixrt's own (and OpenAI's `seed`), beside SGLang's
RADIXRT_SAMPLING_PARAMS = ("seed", "choices", "tool_call_grammar")
# SGLang parameters whose feature radixrt lacks: accepted at their "off" value, refused by name otherwise
NOT_YET = {"beam_width": "beam search", "watermark": "watermarking"}


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
    # SGLang's: the output stops once its text matches one of these (searched as it grows; the match stays
    # in the text, finish reason {"type": "stop", "matched": pattern}); stop_regex.py runs them
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = (
        True  # passed to the tokenizer's decode (slow tokenizers use it)
    )
    no_stop_trim: bool = False  # keep the matched stop string at the end of the text
    stream_interval: int | None = (
        None  # a stream sends a chunk every this many tokens (None: every token)
    )
    custom_params: dict[str, Any] | None = (
        None  # SGLang's input to a custom logit processor; radixrt has none
    )
    seed: int | None = None  # SGLang calls it sampling_seed (accepted as that too)
    n: int = 1
    beam_width: int | None = None
    structural_tag: str | None = None
    watermark: Any = None
    # constrained decoding: at most one of these
    regex: str | None = None
    json_schema: str | None = None  # a JSON string, as SGLang takes it
    choices: list[str] | None = None
    # radixrt's: tool calls in the fallback format (constrained/tool_call_regex.py); the OpenAI chat route
    # sets it for tools with tool_choice required / a named function / auto once a call is opened
    tool_call_grammar: str | None = None
    ebnf: str | None = (
        None  # SGLang's: a context-free grammar (GBNF `root ::= ...`, or Lark); llguidance enforces it
    )
    # OpenAI's / SGLang's: token id (a decimal string, as JSON keys are) -> added to that token's logit
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
        if isinstance(
            d.get("logit_bias"), dict
        ):  # ids as ints (the Engine) or strings (JSON) alike
            d["logit_bias"] = {
                str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v
                for k, v in d["logit_bias"].items()
            }
        p = cls(**d)
        p.validate()
        return p

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def logit_bias_pairs(self) -> list[tuple[int, float]]:
        return [(int(k), float(v)) for k, v in (self.logit_bias or {}).items()]

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def validate(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ValueError(f"sampling parameter {name} {what}, got {getattr(self, name)!r}")

        def is_int(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x: Any) -> bool:  # finite: NaN and +-inf are refused
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        need(
            is_int(self.max_new_tokens) and 0 <= self.max_new_tokens <= MAX_INT,
            "max_new_tokens",
            f"must be an int in [0, {MAX_INT}]",
        )
        need(
            is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= MAX_INT,
            "min_new_tokens",
            f"must be an int in [0, {MAX_INT}]",
        )
        need(
            is_num(self.temperature)
            and (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= 100.0),
            "temperature",
            f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, 100]",
        )
        need(is_num(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        need(
            is_int(self.top_k) and (self.top_k == -1 or 1 <= self.top_k <= MAX_INT),
            "top_k",
            f"must be -1 or in [1, {MAX_INT}]",
        )
        need(is_num(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        need(
            is_num(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            "must be in [-2, 2]",
        )
        need(
            is_num(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            "must be in [-2, 2]",
        )
        need(
            is_num(self.repetition_penalty)
            and MIN_REPETITION_PENALTY <= self.repetition_penalty <= 10.0,
            "repetition_penalty",
            f"must be in [{MIN_REPETITION_PENALTY:g}, 10]",
        )
        need(
            isinstance(self.stop, list)
            and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in self.stop)
            and len(self.stop) <= MAX_STOP_STRINGS,
            "stop",
            f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings of at most "
            f"{MAX_STOP_STRING_CHARS} characters",
        )
        need(
            isinstance(self.stop_token_ids, list)
            and len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS
            and all(is_int(t) and 0 <= t <= MAX_INT for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
        )
        need(
            isinstance(self.stop_regex, list)
            and len(self.stop_regex) <= MAX_STOP_REGEX
            and all(
                isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in self.stop_regex
            ),
            "stop_regex",
            f"must be a regex or a list of at most {MAX_STOP_REGEX} regexes of at most "
            f"{MAX_STOP_STRING_CHARS} characters",
        )
        from radixrt.runtime.stop_regex import check_stop_regex  # names the pattern it cannot run

        for pattern in self.stop_regex:
            check_stop_regex(pattern)
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
        ):
            need(isinstance(getattr(self, name), bool), name, "must be a bool")
        need(
            self.stream_interval is None
            or (is_int(self.stream_interval) and 1 <= self.stream_interval <= MAX_INT),
            "stream_interval",
            f"must be an int in [1, {MAX_INT}]",
        )
        need(
            self.custom_params is None
            or (
                isinstance(self.custom_params, dict)
                and len(self.custom_params) <= MAX_CUSTOM_PARAMS_KEYS
            ),
            "custom_params",
            f"must be an object of at most {MAX_CUSTOM_PARAMS_KEYS} keys",
        )
        need(
            self.beam_width is None or (is_int(self.beam_width) and self.beam_width >= 1),
            "beam_width",
            "must be an int >= 1",
        )
        for name, feature in NOT_YET.items():
            value = getattr(self, name)
            if value and not (name == "beam_width" and value == 1):  # "" / None / 1: off
                raise ValueError(
                    f"sampling parameter {name}: {feature} is not supported by radixrt yet"
                )
        need(
            self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**63),
            "seed",
            "must be an int >= 0",
        )
        need(is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"must be an int in [1, {MAX_N}]")
        need(
            self.regex is None
            or (isinstance(self.regex, str) and len(self.regex) <= MAX_REGEX_CHARS),
            "regex",
            f"must be a string of at most {MAX_REGEX_CHARS} characters",
        )
        need(
            self.json_schema is None
            or (
                isinstance(self.json_schema, str) and len(self.json_schema) <= MAX_JSON_SCHEMA_CHARS
            ),
            "json_schema",
            f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
        )
        need(
            self.choices is None
            or (
                isinstance(self.choices, list)
                and 0 < len(self.choices) <= MAX_CHOICES
                and all(isinstance(c, str) and len(c) <= MAX_CHOICE_CHARS for c in self.choices)
            ),
            "choices",
            f"must be a non-empty list of at most {MAX_CHOICES} strings of at most "
            f"{MAX_CHOICE_CHARS} characters",
        )
        need(
            self.ebnf is None
            or (isinstance(self.ebnf, str) and 0 < len(self.ebnf) <= MAX_JSON_SCHEMA_CHARS),
            "ebnf",
            f"must be a grammar string of at most {MAX_JSON_SCHEMA_CHARS} characters",
        )
        need(
            self.tool_call_grammar is None
            or (
                isinstance(self.tool_call_grammar, str)
                and len(self.tool_call_grammar) <= MAX_JSON_SCHEMA_CHARS
            ),
            "tool_call_grammar",
            f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
        )
        need(
            self.logit_bias is None
            or (
                isinstance(self.logit_bias, dict)
                and len(self.logit_bias) <= MAX_LOGIT_BIAS
                and all(isinstance(k, str) and _TOKEN_ID_KEY.fullmatch(k) for k in self.logit_bias)
                and all(is_num(v) and -100 <= v <= 100 for v in self.logit_bias.values())
            ),
            "logit_bias",
            f"must map at most {MAX_LOGIT_BIAS} token ids to numbers in [-100, 100]",
        )
        need(
            self.structural_tag is None
            or (
                isinstance(self.structural_tag, str)
                and len(self.structural_tag) <= MAX_JSON_SCHEMA_CHARS
            ),
            "structural_tag",
            f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
        )
        if self.structural_tag == "":
            self.structural_tag = None  # as SGLang: an empty constraint is no constraint
        if (
            self.structural_tag is not None
        ):  # its shape is checked here, so a bad one is a 400 at the edge
            from radixrt.runtime.constrained.structural_tag import structural_tag_grammar

            structural_tag_grammar(self.structural_tag)
        constraints = [k for k in CONSTRAINT_FIELDS if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise ValueError(f"sampling parameters {' and '.join(constraints)} cannot be combined")
        if constraints and not self.ignore_eos:
            from radixrt.runtime.constraint_conflicts import check_min_new_tokens

            check_min_new_tokens(constraints[0], getattr(self, constraints[0]), self.min_new_tokens)
