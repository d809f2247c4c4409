"""The OpenAI routes' sampling fields as SGLang sampling parameters: names mapped, constraints
(regex, json_schema, ebnf, response_format) turned into one constraint parameter."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from radixrt.runtime.serving.http.protocol import APIError, _SamplingFields

JSON_OBJECT_WHITESPACE = {"whitespace_flexible": False, "whitespace_pattern": "[ \\t\\n\\r]{0,40}"}


def json_object_grammar(max_depth: int) -> str:
    """json_object as real JSON: any object whose values nest at most max_depth levels (the object
    itself is level 1), with the whitespace JSON allows (bounded per gap, so it cannot loop). A Lark
    grammar over a JSON schema llguidance enforces; the levels are $defs, each referring to the one
    below, so the grammar grows linearly with the depth."""
    scalar = {"type": ["string", "number", "boolean", "null"]}
    defs = {"level1": scalar}  # levelK: a value whose containers nest at most K - 1 deep
    for k in range(2, max_depth + 1):
        below = {"$ref": f"#/$defs/level{k - 1}"}
        defs[f"level{k}"] = {
            "anyOf": [
                scalar,
                {"type": "array", "items": below},
                {"type": "object", "additionalProperties": below},
            ]
        }
    schema = {
        "$defs": defs,
        "type": "object",
        "additionalProperties": {"$ref": f"#/$defs/level{max_depth}"},
        "x-guidance": JSON_OBJECT_WHITESPACE,
    }
    return "start: %json " + json.dumps(schema, separators=(",", ":"))


JSON_OBJECT_LARK = json_object_grammar(16)  # the default --json-object-max-depth


def constraint_from_request(req: _SamplingFields, json_object_depth: int = 16) -> dict[str, str]:
    """regex / json_schema / ebnf / response_format -> the sampling-param form (json_schema as a
    JSON string)."""
    out: dict[str, str] = {}
    if req.regex is not None:
        out["regex"] = req.regex
    if req.json_schema is not None:
        out["json_schema"] = req.json_schema
    if req.ebnf is not None:
        out["ebnf"] = req.ebnf
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if out:
            raise APIError(
                "response_format cannot be combined with regex, json_schema or ebnf",
                param="response_format",
            )
        if rf.type == "json_object":
            if importlib.util.find_spec("llguidance") is not None:
                out["ebnf"] = json_object_grammar(json_object_depth)
            else:
                out["json_schema"] = '{"type": "object"}'
        elif rf.type == "grammar":
            if not rf.grammar:
                raise APIError(
                    "response_format grammar needs grammar (a Lark or GBNF grammar)",
                    param="response_format",
                )
            out["ebnf"] = rf.grammar
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError(
                    "response_format json_schema needs json_schema.schema", param="response_format"
                )
            out["json_schema"] = json.dumps(rf.json_schema.schema_)
    return out


def sampling_dict(
    req: _SamplingFields, max_new_tokens: int, json_object_depth: int = 16
) -> dict[str, Any]:
    """The OpenAI fields as a SamplingParams dict (not yet validated: SamplingParams.from_dict does
    that)."""
    d: dict[str, Any] = {"max_new_tokens": max_new_tokens, "n": req.n}
    pairs = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "seed": req.seed,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "min_new_tokens": req.min_tokens,
        "stop_token_ids": req.stop_token_ids,
        "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "stop": req.stop,
        "logit_bias": req.logit_bias,
    }
    d.update({k: v for k, v in pairs.items() if v is not None})
    d.update(constraint_from_request(req, json_object_depth))
    d.update(beam_search_fields(req))
    return d


def beam_search_fields(req: _SamplingFields) -> dict[str, Any]:
    """use_beam_search (vLLM's): best_of beams wide (n when best_of is not given), n returned."""
    if not req.use_beam_search:
        if req.best_of not in (None, req.n):
            raise APIError(
                "best_of other than n needs use_beam_search (radixrt does not sample best_of "
                "candidates to keep n)",
                param="best_of",
            )
        return {}
    width = req.best_of if req.best_of is not None else req.n
    if width < 2:
        raise APIError(
            "use_beam_search needs a beam width above 1: best_of, or n when best_of is not given",
            param="best_of",
        )
    out: dict[str, Any] = {"beam_width": width}
    if req.length_penalty is not None:
        out["length_penalty"] = req.length_penalty
    if req.early_stopping is not None:
        out["early_stopping"] = req.early_stopping
    return out
