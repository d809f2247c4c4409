"""The OpenAI routes' sampling fields as SGLang sampling parameters: names mapped, constraints (regex,
json_schema, ebnf, response_format) turned into one constraint parameter."""
from __future__ import annotations

import importlib.util
import json
from typing import Any

from radixrt.runtime.serving.protocol import APIError, _SamplingFields

# json_object as real JSON: any object, nested to any depth, with the whitespace JSON allows (bounded per
# gap, so it cannot loop) -- a Lark grammar llguidance enforces; without llguidance, a depth-capped regex
JSON_OBJECT_LARK = ('start: %json {"type": "object", "x-guidance": {"whitespace_flexible": false, '
                    '"whitespace_pattern": "[ \\t\\n\\r]{0,40}"}}')


def constraint_from_request(req: _SamplingFields) -> dict[str, str]:
    """regex / json_schema / ebnf / response_format -> the sampling-param form (json_schema as a JSON string)."""
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
            raise APIError("response_format cannot be combined with regex, json_schema or ebnf", param="response_format")
        if rf.type == "json_object":
            if importlib.util.find_spec("llguidance") is not None:
                out["ebnf"] = JSON_OBJECT_LARK
            else:
                out["json_schema"] = '{"type": "object"}'
        elif rf.type == "grammar":
            if not rf.grammar:
                raise APIError("response_format grammar needs grammar (a Lark or GBNF grammar)", param="response_format")
            out["ebnf"] = rf.grammar
        else:
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError("response_format json_schema needs json_schema.schema", param="response_format")
            out["json_schema"] = json.dumps(rf.json_schema.schema_)
    return out


def sampling_dict(req: _SamplingFields, max_new_tokens: int) -> dict[str, Any]:
    """The OpenAI fields as a SamplingParams dict (not yet validated: SamplingParams.from_dict does that)."""
    d: dict[str, Any] = {"max_new_tokens": max_new_tokens, "n": req.n}
    pairs = {"temperature": req.temperature, "top_p": req.top_p, "presence_penalty": req.presence_penalty,
             "frequency_penalty": req.frequency_penalty, "seed": req.seed, "top_k": req.top_k, "min_p": req.min_p,
             "repetition_penalty": req.repetition_penalty, "min_new_tokens": req.min_tokens,
             "stop_token_ids": req.stop_token_ids, "ignore_eos": req.ignore_eos,
             "skip_special_tokens": req.skip_special_tokens, "stop": req.stop, "logit_bias": req.logit_bias}
    d.update({k: v for k, v in pairs.items() if v is not None})
    d.update(constraint_from_request(req))
    return d
