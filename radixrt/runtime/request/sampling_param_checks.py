"""The bounds a request's sampling parameters must keep, and the checks that enforce them.

Each check covers one concern and raises ValueError naming the parameter (and the value it got).
`validate_sampling_params` runs them all in a fixed order, so the first bad field is the one named.
The checks take a SamplingParams (not imported here: sampling_params.py imports this module).
"""

from __future__ import annotations

import math
import re
from typing import Any

from radixrt.runtime.request.grammar_bounds import check_spec_bounds
from radixrt.runtime.request.sampling_param_names import CONSTRAINT_FIELDS, NOT_YET

MAX_N = 16
MAX_BEAM_WIDTH = 16
# Bounds a single request cannot exceed (each refusal names the parameter). Large enough for any
# real use, small enough that no value costs the scheduler more than a request's own work.
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
# ASCII digits, no leading zero: one key per token id
_TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]{0,8}")


def need(p: Any, cond: bool, name: str, what: str) -> None:
    """Refuse parameter `name` of `p` (saying what it must be) unless `cond` holds."""
    if not cond:
        raise ValueError(f"sampling parameter {name} {what}, got {getattr(p, name)!r}")


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    """A finite int or float: NaN and +-inf are refused."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_short_str(x: Any, max_chars: int, min_chars: int = 0) -> bool:
    return isinstance(x, str) and min_chars <= len(x) <= max_chars


def check_lengths(p: Any) -> None:
    """max_new_tokens and min_new_tokens."""
    for name in ("max_new_tokens", "min_new_tokens"):
        value = getattr(p, name)
        need(p, is_int(value) and 0 <= value <= MAX_INT, name, f"must be an int in [0, {MAX_INT}]")


def check_sampling_ranges(p: Any) -> None:
    """temperature, top_p, top_k and min_p: what the draw keeps and how it flattens it."""
    need(
        p,
        is_num(p.temperature)
        and (p.temperature == 0.0 or MIN_TEMPERATURE <= p.temperature <= 100.0),
        "temperature",
        f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, 100]",
    )
    need(p, is_num(p.top_p) and 0.0 < p.top_p <= 1.0, "top_p", "must be in (0, 1]")
    need(
        p,
        is_int(p.top_k) and (p.top_k == -1 or 1 <= p.top_k <= MAX_INT),
        "top_k",
        f"must be -1 or in [1, {MAX_INT}]",
    )
    need(p, is_num(p.min_p) and 0.0 <= p.min_p <= 1.0, "min_p", "must be in [0, 1]")


def check_penalties(p: Any) -> None:
    """frequency_penalty, presence_penalty and repetition_penalty."""
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(p, name)
        need(p, is_num(value) and -2.0 <= value <= 2.0, name, "must be in [-2, 2]")
    need(
        p,
        is_num(p.repetition_penalty) and MIN_REPETITION_PENALTY <= p.repetition_penalty <= 10.0,
        "repetition_penalty",
        f"must be in [{MIN_REPETITION_PENALTY:g}, 10]",
    )


def check_stop_conditions(p: Any) -> None:
    """stop, stop_token_ids and stop_regex (each pattern must be one stop_regex.py can run)."""
    need(
        p,
        isinstance(p.stop, list)
        and all(is_short_str(s, MAX_STOP_STRING_CHARS, 1) for s in p.stop)
        and len(p.stop) <= MAX_STOP_STRINGS,
        "stop",
        f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings of at most "
        f"{MAX_STOP_STRING_CHARS} characters",
    )
    need(
        p,
        isinstance(p.stop_token_ids, list)
        and len(p.stop_token_ids) <= MAX_STOP_TOKEN_IDS
        and all(is_int(t) and 0 <= t <= MAX_INT for t in p.stop_token_ids),
        "stop_token_ids",
        f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
    )
    need(
        p,
        isinstance(p.stop_regex, list)
        and len(p.stop_regex) <= MAX_STOP_REGEX
        and all(is_short_str(s, MAX_STOP_STRING_CHARS, 1) for s in p.stop_regex),
        "stop_regex",
        f"must be a regex or a list of at most {MAX_STOP_REGEX} regexes of at most "
        f"{MAX_STOP_STRING_CHARS} characters",
    )
    from radixrt.runtime.request.stop_regex import (
        check_stop_regex,
    )  # names the pattern it cannot run

    for pattern in p.stop_regex:
        check_stop_regex(pattern)


def check_output_options(p: Any) -> None:
    """The flags shaping the output text, stream_interval and custom_params."""
    for name in (
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
    ):
        need(p, isinstance(getattr(p, name), bool), name, "must be a bool")
    need(
        p,
        p.stream_interval is None
        or (is_int(p.stream_interval) and 1 <= p.stream_interval <= MAX_INT),
        "stream_interval",
        f"must be an int in [1, {MAX_INT}]",
    )
    need(
        p,
        p.custom_params is None
        or (isinstance(p.custom_params, dict) and len(p.custom_params) <= MAX_CUSTOM_PARAMS_KEYS),
        "custom_params",
        f"must be an object of at most {MAX_CUSTOM_PARAMS_KEYS} keys",
    )


def check_not_yet_supported(p: Any) -> None:
    """The NOT_YET parameters: at their "off" value ("" / None)."""
    for name, feature in NOT_YET.items():
        if getattr(p, name):
            raise ValueError(
                f"sampling parameter {name}: {feature} is not supported by radixrt yet"
            )


# what beam search does not combine with: it scores beams by the model's own log-probabilities
# (transformers' do_sample=False beam search), and its beams are not text-checked as they grow
NOT_WITH_BEAMS = ("frequency_penalty", "presence_penalty", "logit_bias", "stop", "stop_regex")


def check_beam_search(p: Any) -> None:
    """beam_width, length_penalty, early_stopping; with beam_width > 1, n (the beams returned) at
    most beam_width and nothing that would change the beams' scores."""
    need(
        p,
        p.beam_width is None or (is_int(p.beam_width) and 1 <= p.beam_width <= MAX_BEAM_WIDTH),
        "beam_width",
        f"must be an int in [1, {MAX_BEAM_WIDTH}]",
    )
    need(
        p,
        is_num(p.length_penalty) and -10 <= p.length_penalty <= 10,
        "length_penalty",
        "must be a number in [-10, 10]",
    )
    ok = isinstance(p.early_stopping, bool) or p.early_stopping == "never"
    need(p, ok, "early_stopping", 'must be true, false or "never"')
    if not p.is_beam:
        return
    ok = is_int(p.n) and 1 <= p.n <= p.beam_width
    need(p, ok, "n", f"must be an int in [1, beam_width = {p.beam_width}] (the beams returned)")
    need(p, p.max_new_tokens >= 1, "max_new_tokens", "must be >= 1 for beam search")
    changed = [name for name in NOT_WITH_BEAMS if getattr(p, name)]
    if p.repetition_penalty != 1.0:
        changed.append("repetition_penalty")
    if changed:
        raise ValueError(
            f"sampling parameter {changed[0]} cannot be combined with beam search (beam_width > "
            "1): beams are scored by the model's own log-probabilities"
        )


def check_seed_and_n(p: Any) -> None:
    need(
        p, p.seed is None or (is_int(p.seed) and 0 <= p.seed < 2**63), "seed", "must be an int >= 0"
    )
    need(p, is_int(p.n) and 1 <= p.n <= MAX_N, "n", f"must be an int in [1, {MAX_N}]")


def check_constraint_specs(p: Any) -> None:
    """regex, json_schema, choices, ebnf and tool_call_grammar: each, if given, of bounded size."""
    need(
        p,
        p.regex is None or is_short_str(p.regex, MAX_REGEX_CHARS),
        "regex",
        f"must be a string of at most {MAX_REGEX_CHARS} characters",
    )
    need(
        p,
        p.json_schema is None or is_short_str(p.json_schema, MAX_JSON_SCHEMA_CHARS),
        "json_schema",
        f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
    )
    need(
        p,
        p.choices is None
        or (
            isinstance(p.choices, list)
            and 0 < len(p.choices) <= MAX_CHOICES
            and all(is_short_str(c, MAX_CHOICE_CHARS) for c in p.choices)
        ),
        "choices",
        f"must be a non-empty list of at most {MAX_CHOICES} strings of at most "
        f"{MAX_CHOICE_CHARS} characters",
    )
    need(
        p,
        p.ebnf is None or is_short_str(p.ebnf, MAX_JSON_SCHEMA_CHARS, 1),
        "ebnf",
        f"must be a grammar string of at most {MAX_JSON_SCHEMA_CHARS} characters",
    )
    need(
        p,
        p.tool_call_grammar is None or is_short_str(p.tool_call_grammar, MAX_JSON_SCHEMA_CHARS),
        "tool_call_grammar",
        f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
    )
    check_spec_bounds(p)  # the regexes and counts inside them (grammar_bounds.py)


def check_logit_bias(p: Any) -> None:
    """logit_bias: at most MAX_LOGIT_BIAS token ids (decimal strings), each to a number in
    [-100, 100]."""
    need(
        p,
        p.logit_bias is None
        or (
            isinstance(p.logit_bias, dict)
            and len(p.logit_bias) <= MAX_LOGIT_BIAS
            and all(isinstance(k, str) and _TOKEN_ID_KEY.fullmatch(k) for k in p.logit_bias)
            and all(is_num(v) and -100 <= v <= 100 for v in p.logit_bias.values())
        ),
        "logit_bias",
        f"must map at most {MAX_LOGIT_BIAS} token ids to numbers in [-100, 100]",
    )


def check_structural_tag(p: Any) -> None:
    """structural_tag: bounded, "" read as none (as SGLang), and its shape checked so a bad one is a
    400 at the edge."""
    need(
        p,
        p.structural_tag is None or is_short_str(p.structural_tag, MAX_JSON_SCHEMA_CHARS),
        "structural_tag",
        f"must be a JSON string of at most {MAX_JSON_SCHEMA_CHARS} characters",
    )
    if p.structural_tag == "":
        p.structural_tag = None  # as SGLang: an empty constraint is no constraint
    if p.structural_tag is not None:
        from radixrt.runtime.request.structural_tag import structural_tag_grammar

        structural_tag_grammar(p.structural_tag)


def check_one_constraint(p: Any) -> None:
    """At most one constraint, and (unless ignore_eos) one that can fill min_new_tokens."""
    constraints = [k for k in CONSTRAINT_FIELDS if getattr(p, k) is not None]
    if len(constraints) > 1:
        raise ValueError(f"sampling parameters {' and '.join(constraints)} cannot be combined")
    if constraints and not p.ignore_eos:
        from radixrt.runtime.request.constraint_conflicts import check_min_new_tokens

        check_min_new_tokens(constraints[0], getattr(p, constraints[0]), p.min_new_tokens)


# in this order: a request with several bad fields is told about the first
CHECKS = (
    check_lengths,
    check_sampling_ranges,
    check_penalties,
    check_stop_conditions,
    check_output_options,
    check_not_yet_supported,
    check_beam_search,
    check_seed_and_n,
    check_constraint_specs,
    check_logit_bias,
    check_structural_tag,
    check_one_constraint,
)


def validate_sampling_params(p: Any) -> None:
    """Raise ValueError naming the first out-of-bounds parameter of `p` (an empty structural_tag
    becomes None)."""
    for check in CHECKS:
        check(p)
