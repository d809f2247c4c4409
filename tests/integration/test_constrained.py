"""Constrained decoding through Engine.generate, greedy, on the outlines backend (llguidance and auto:
test_grammar_backends.py, test_budget_steering_engine.py), with a tiny random Llama and the default model's
tokenizer: what these check is the grammar (every output a complete match, valid under `jsonschema`),
not the model's choice of text. Budget steering keeps even a random model on a path that finishes within
max_new_tokens, so every output must finish; a random model wanders into far more of each grammar than
the real one (the real model's JSON under the same schemas: test_grammar_backends.py).

Truths: `jsonschema` (format checker on) validates every JSON output; `re.fullmatch` judges
regex outputs; choices must come back verbatim. (Jump-forward on == off: test_jump_forward.py.)
The schema suite (SCHEMAS plus SUITE_NAMES from the unit suite, >= 30 in all) must cover every
category issue #5 names at least twice; test_schemas_give_valid_json checks that from the
schemas themselves (CATEGORIES), so shrinking the suite fails loudly.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from radixrt import Engine

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_json_schema_regex import SUITE, validator  # noqa: E402

MAX_NEW_TOKENS = 200
MIN_SCHEMAS = 30


def _str(**kw) -> dict:
    return {"type": "string", **kw}


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


# Schemas whose every value is bounded (enums, numbers, short strings, small arrays) or
# typical of extraction tasks; the model writes them within MAX_NEW_TOKENS. Free emails are
# unbounded (format + maxLength cannot be enforced together), and the 135M model rambles in a
# bare email field ("example.com.com..."), so emails sit next to a name the model copies from.
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "temperature_c": {"type": "number", "minimum": -50, "maximum": 60},
            "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
            "date": {"type": "string", "format": "date"},
        },
        "required": ["city", "temperature_c", "conditions", "date"],
    },
    "todo_list": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 2,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "maxLength": 25},
                        "done": {"type": "boolean"},
                    },
                    "required": ["task", "done"],
                },
            }
        },
        "required": ["items"],
    },
    "event": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "starts": {"type": "string", "format": "date-time"},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["id", "starts", "priority"],
    },
    "shape": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "circle"},
                    "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                },
                "required": ["kind", "radius"],
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "square"},
                    "side": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                "required": ["kind", "side"],
            },
        ]
    },
    "nullable_choice": {
        "type": "object",
        "properties": {
            "answer": {"anyOf": [{"enum": ["yes", "no"]}, {"type": "null"}]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["answer", "score"],
    },
    "review": {
        "type": "object",
        "properties": {
            "sentiment": {"enum": ["positive", "negative", "neutral"]},
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "keywords": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "maxItems": 3,
            },
        },
        "required": ["sentiment", "stars", "keywords"],
    },
    "invoice": {
        "type": "object",
        "properties": {
            "invoice_id": _str(format="uuid"),
            "issued": _str(format="date"),
            "customer": {
                "type": "object",
                "properties": {"name": _str(maxLength=20), "email": _str(format="email")},
                "required": ["name", "email"],
                "additionalProperties": False,
            },
            "line_items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "description": _str(maxLength=15),
                        "quantity": _int(1, 99),
                        "unit_price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
                    },
                    "required": ["description", "quantity", "unit_price"],
                    "additionalProperties": False,
                },
            },
            "currency": {"enum": ["USD", "EUR", "GBP"]},
        },
        "required": ["invoice_id", "issued", "customer", "line_items", "currency"],
        "additionalProperties": False,
    },
    "shipping_addresses": {
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "street": _str(maxLength=25),
                    "city": _str(maxLength=20),
                    "postal_code": _str(pattern="^[0-9]{5}$"),
                    "country": {"enum": ["US", "DE", "FR", "JP"]},
                },
                "required": ["street", "city", "postal_code", "country"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "ship_to": {"$ref": "#/$defs/address"},
            "bill_to": {"$ref": "#/$defs/address"},
        },
        "required": ["ship_to", "bill_to"],
    },
    "calendar_entry": {
        "type": "object",
        "properties": {
            "id": _str(format="uuid"),
            "title": _str(maxLength=25),
            "day": _str(format="date"),
            "all_day": {"type": "boolean"},
            "attendees": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"name": _str(maxLength=15), "email": _str(format="email")},
                    "required": ["name", "email"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["id", "title", "day", "all_day", "attendees"],
    },
    "user_profile": {
        "type": "object",
        "properties": {
            "username": _str(pattern="^[a-z][a-z0-9_]{2,11}$"),
            "display_name": {"anyOf": [_str(maxLength=20), {"type": "null"}]},
            "age": {"type": ["integer", "null"], "minimum": 13, "maximum": 120},
            "bio": {"type": ["string", "null"], "maxLength": 25},
            "verified": {"type": "boolean"},
        },
        "required": ["username", "display_name", "age", "bio", "verified"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "name": _str(maxLength=25),
            "category": {"enum": ["books", "electronics", "garden", "toys"]},
            "price": {"type": "number", "minimum": 0.01, "maximum": 9999.99},
            "stock": _int(0, 10000),
            "rating": {"type": "number", "minimum": 0, "maximum": 5},
        },
        "required": ["name", "category", "price", "stock", "rating"],
        "additionalProperties": False,
    },
    "service_config": {
        "type": "object",
        "properties": {
            "server": {
                "type": "object",
                "properties": {
                    "port": _int(1, 65535),
                    "workers": _int(1, 64),
                    "tls": {
                        "type": "object",
                        "properties": {
                            "enabled": {"type": "boolean"},
                            "min_version": {"enum": ["1.2", "1.3"]},
                        },
                        "required": ["enabled", "min_version"],
                        "additionalProperties": False,
                    },
                },
                "required": ["port", "workers", "tls"],
                "additionalProperties": False,
            },
            "logging": {
                "type": "object",
                "properties": {
                    "level": {"enum": ["debug", "info", "warning", "error"]},
                    "max_files": _int(1, 10),
                },
                "required": ["level", "max_files"],
                "additionalProperties": False,
            },
        },
        "required": ["server", "logging"],
        "additionalProperties": False,
    },
    "team_roster": {
        "type": "object",
        "properties": {
            "team": _str(maxLength=20),
            "members": {
                "type": "array",
                "minItems": 2,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": _str(maxLength=15),
                        "role": {"enum": ["lead", "engineer", "designer", "qa"]},
                    },
                    "required": ["name", "role"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["team", "members"],
    },
    "ui_event": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"type": {"const": "click"}, "x": _int(0, 1920), "y": _int(0, 1080)},
                "required": ["type", "x", "y"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "keypress"},
                    "key": _str(minLength=1, maxLength=1),
                    "shift": {"type": "boolean"},
                },
                "required": ["type", "key", "shift"],
                "additionalProperties": False,
            },
        ]
    },
    "contact_lookup": {
        "$defs": {
            "contact": {
                "type": "object",
                "properties": {
                    "name": _str(maxLength=20),
                    "email": _str(format="email"),
                    "phone": _str(pattern="^\\+?[0-9]{7,12}$"),
                },
                "required": ["name", "email", "phone"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "query": _str(maxLength=20),
            "match": {"anyOf": [{"$ref": "#/$defs/contact"}, {"type": "null"}]},
            "fallback": {"anyOf": [{"$ref": "#/$defs/contact"}, {"type": "null"}]},
        },
        "required": ["query", "match", "fallback"],
    },
    "mailing_list": {
        "type": "object",
        "properties": {
            "list_name": _str(maxLength=20),
            "subscribers": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"name": _str(maxLength=15), "email": _str(format="email")},
                    "required": ["name", "email"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["list_name", "subscribers"],
        "additionalProperties": False,
    },
    "temperature_log": {
        "type": "object",
        "properties": {
            "sensor": _str(maxLength=12),
            "readings_c": {"type": "array", "items": _int(-40, 50), "minItems": 3, "maxItems": 5},
            "calibration_offset": _int(-10, 10),
            "lowest_alarm": {"type": "integer", "minimum": -273, "exclusiveMaximum": -100},
        },
        "required": ["sensor", "readings_c", "calibration_offset", "lowest_alarm"],
    },
    "geo_measurement": {
        "type": "object",
        "properties": {
            "confidence": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "latitude": {"type": "number", "minimum": -90, "maximum": 90},
            "longitude": {"type": "number", "exclusiveMinimum": -180, "maximum": 180},
            "altitude_m": {"type": "number", "exclusiveMinimum": -500, "exclusiveMaximum": 9000},
        },
        "required": ["confidence", "latitude", "longitude", "altitude_m"],
        "additionalProperties": False,
    },
    "api_envelope": {
        "type": "object",
        "properties": {
            "api_version": {"const": "v2"},
            "status": {"enum": ["ok", "error"]},
            "data": {
                "type": "object",
                "properties": {
                    "count": _int(0, 100),
                    "next_page": {"type": ["integer", "null"], "minimum": 2, "maximum": 50},
                    "source": {"const": {"name": "catalog", "region": "eu"}},
                },
                "required": ["count", "next_page", "source"],
                "additionalProperties": False,
            },
        },
        "required": ["api_version", "status", "data"],
        "additionalProperties": False,
    },
    "order_totals": {
        "$defs": {
            "money": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "minimum": 0, "maximum": 100000},
                    "currency": {"enum": ["USD", "EUR"]},
                },
                "required": ["amount", "currency"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "subtotal": {"$ref": "#/$defs/money"},
            "tax": {"$ref": "#/$defs/money"},
            "total": {"$ref": "#/$defs/money"},
        },
        "required": ["subtotal", "tax", "total"],
        "additionalProperties": False,
    },
    "hotel_booking": {
        "type": "object",
        "properties": {
            "booking_id": _str(format="uuid"),
            "check_in": _str(format="date"),
            "check_out": _str(format="date"),
            "guests": _int(1, 8),
            "room": {"enum": ["single", "double", "suite"]},
            "notes": {"type": ["string", "null"], "maxLength": 25},
        },
        "required": ["booking_id", "check_in", "check_out", "guests", "room", "notes"],
        "additionalProperties": False,
    },
    "survey_response": {
        "type": "object",
        "properties": {
            "respondent": _int(1, 9999),
            "answers": {
                "type": "array",
                "items": {"enum": ["agree", "neutral", "disagree"]},
                "minItems": 3,
                "maxItems": 3,
            },
            "comment": {"anyOf": [_str(maxLength=25), {"type": "null"}]},
            "submitted": _str(format="date"),
        },
        "required": ["respondent", "answers", "comment", "submitted"],
    },
}
# Source text for extraction-style schemas (put before the schema in the prompt).
CONTEXTS = {
    "invoice": "Invoice 3f2b8c1e-9a4d-4e7b-8c21-5d6f7a8b9c0d, issued 2024-03-15 to Ava Stone (ava.stone@example.com): "
    "2 desk lamps at 24.50 each and 1 office chair at 189.00, billed in EUR.",
    "shipping_addresses": "Ship to 12 Oak Lane, Springfield 62704, US. Bill to 4 Rue Cler, Paris 75007, FR.",
    "calendar_entry": "Quarterly review (id 7c9e6679-7425-40de-944b-e07fc1f90ae7) on 2024-06-03, all day, "
    "with Bob (bob@example.com) and Carol (carol@example.com).",
    "user_profile": "New account: username mia_92, display name Mia, age not given, no bio, email not verified.",
    "product": "The Garden Hose Pro (garden) costs 34.99, 120 units in stock, rated 4.6 out of 5.",
    "service_config": "Serve on port 8443 with 8 workers, TLS on with at least TLS 1.3; log warnings, keep 5 files.",
    "team_roster": "Team Falcon: Priya leads, Tom and Lee are engineers, Ana does QA.",
    "ui_event": "The user pressed the Q key while holding shift.",
    "contact_lookup": "Searching for 'Dana': found Dana Reyes, dana.reyes@mail.com, phone +4915112345678. No fallback.",
    "mailing_list": "The list 'hikers' has Sam (sam@example.com) and Jo (jo@example.com).",
    "temperature_log": "Sensor T-7 read -12, -8, 0 and 3 degrees C; offset -2; the low alarm is at -150.",
    "geo_measurement": "Fix at latitude 48.8584, longitude 2.2945, altitude 35.5 m, confidence 0.92.",
    "api_envelope": "The catalog in region eu returned 20 items; the next page is 2.",
    "order_totals": "Subtotal 80.00 USD, tax 6.40 USD, total 86.40 USD.",
    "hotel_booking": "Booking 0f8fad5b-d9cb-469f-a165-70867728950e: double room for 2 guests, "
    "2024-07-10 to 2024-07-14, late arrival.",
    "survey_response": "Respondent 417 agreed, then was neutral, then disagreed; no comment; sent 2024-02-29.",
}
# from the unit suite: all of these keep strings short or absent
SUITE_NAMES = [
    "array_bounds",
    "enum_mixed",
    "int_bounds",
    "number_exclusive",
    "multiple_of",
    "tuple_2020",
    "defs_ref",
    "allof_merge",
    "unicode_keys",
    "map_values",
    "const",
    "dependent_required",
]
# The categories issue #5 names, each judged on a subschema (any depth) of a suite schema.
CATEGORIES = {
    "nesting": lambda s: (
        s.get("type") == "object"
        and any(
            isinstance(p, dict)
            and ("properties" in p or "$ref" in p or "properties" in (p.get("items") or {}))
            for p in s.get("properties", {}).values()
        )
    ),
    "array bounds": lambda s: s.get("type") == "array" and ("minItems" in s or "maxItems" in s),
    "enum": lambda s: "enum" in s,
    "const": lambda s: "const" in s,
    "$ref/$defs": lambda s: "$ref" in s,
    "anyOf": lambda s: "anyOf" in s,
    "nullable": lambda s: (
        s.get("type") == "null" or (isinstance(s.get("type"), list) and "null" in s["type"])
    ),
    "format date": lambda s: s.get("format") == "date",
    "format email": lambda s: s.get("format") == "email",
    "format uuid": lambda s: s.get("format") == "uuid",
    "numeric bounds": lambda s: any(
        k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    ),
    "closed object": lambda s: s.get("additionalProperties") is False,
}


def subschemas(schema):
    """Every dict in the schema tree ($defs included), the schema first."""
    if isinstance(schema, dict):
        yield schema
        for v in schema.values():
            yield from subschemas(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from subschemas(v)


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # outlines suite
    eng = Engine(
        model_path=tiny_model_dir,
        dtype="float32",
        grammar_compile_timeout=120.0,
        grammar_backend="outlines",
    )
    yield eng
    eng.shutdown()


def run_schemas(engine, schemas: dict, **extra):
    prompts = [
        chat(
            engine.tokenizer,
            (f"{CONTEXTS[n]}\n" if n in CONTEXTS else "")
            + f"Reply with a JSON object for this schema:\n{json.dumps(s)}",
        )
        for n, s in schemas.items()
    ]
    params = [
        {"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, **extra}
        for s in schemas.values()
    ]
    return engine.generate(prompts, params, return_logprob=True)


def test_schemas_give_valid_json(engine):
    schemas = {**SCHEMAS, **{n: SUITE[n][0] for n in SUITE_NAMES}}
    assert len(schemas) == len(SCHEMAS) + len(SUITE_NAMES), (
        "a SUITE_NAMES entry shadows a SCHEMAS name"
    )
    assert len({json.dumps(s, sort_keys=True) for s in schemas.values()}) == len(schemas), (
        "duplicate schemas"
    )
    assert len(schemas) >= MIN_SCHEMAS, (
        f"issue #5 asks for >= {MIN_SCHEMAS} schemas, the suite has {len(schemas)}"
    )
    for category, has in CATEGORIES.items():
        names = [n for n, s in schemas.items() if any(has(sub) for sub in subschemas(s))]
        assert len(names) >= 2, f"category {category!r} is covered by {names} only"
    outs = run_schemas(engine, schemas)
    for (name, schema), out in zip(schemas.items(), outs):
        reason = out["meta_info"]["finish_reason"]
        assert reason["type"] == "stop", (
            f"{name}: did not finish within {MAX_NEW_TOKENS} tokens: {out['text']!r}"
        )
        try:
            value = json.loads(out["text"])
        except ValueError as e:
            raise AssertionError(f"{name}: {out['text']!r} is not JSON: {e}") from None
        errors = [e.message for e in validator(schema).iter_errors(value)]
        assert not errors, f"{name}: {out['text']!r} violates the schema: {errors}"


def test_regex_and_choices(engine):
    tok = engine.tokenizer
    regexes = [
        r"[0-9]{3}-[0-9]{3}-[0-9]{4}",
        r"(January|February|March) [1-9], 20[0-9]{2}",
        r"[A-Z][a-z]+ is [a-z]+\.",
    ]
    outs = engine.generate(
        [
            chat(tok, "Give me a phone number."),
            chat(tok, "When is the meeting?"),
            chat(tok, "Describe Paris in three words."),
        ],
        [{"regex": rx, "temperature": 0, "max_new_tokens": 40} for rx in regexes],
    )
    for rx, out in zip(regexes, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop" and re.fullmatch(
            rx, out["text"]
        ), (rx, out["text"])
    choices = ["Paris", "London", "東京", "São Paulo"]
    out = engine.generate(
        chat(tok, "What is the capital of France?"),
        {"choices": choices, "temperature": 0, "max_new_tokens": 10},
    )
    assert out["text"] in choices


def test_bad_constraints_are_refused_before_any_work(engine):
    forwards = engine.scheduler.stats.num_forwards
    killed = engine.scheduler.grammar_backend().pool.num_killed
    for params in (
        {"json_schema": '{"type": "array", "uniqueItems": true}'},
        {"json_schema": "{not json"},
        {"regex": "(?<=a)b"},
    ):
        with pytest.raises(ValueError):
            engine.generate("hi", {**params, "max_new_tokens": 4})
    assert engine.scheduler.stats.num_forwards == forwards, "a refused request reached the model"
    assert engine.scheduler.grammar_backend().pool.num_killed == killed, (
        "refusal waited for a compile timeout"
    )
