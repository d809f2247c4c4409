"""SGLang's `structural_tag` sampling parameter: free text in which tagged segments follow a schema.

SGLang's form: `{"type": "structural_tag", "structures": [{"begin": "<function=f>", "schema": {...},
"end": "</function>"}, ...], "triggers": ["<function="]}`. Text is free until a trigger appears;
from there the segment must be one of the structures whose begin starts with that trigger: its
begin, a JSON value of its schema, its end; then free text again. That is llguidance's StructTag
(lazy lexemes): the spec becomes a Lark grammar that llguidance serves as an `ebnf` constraint.
xgrammar's newer `{"type": "structural_tag", "format": ...}` form is refused by name.
"""

from __future__ import annotations

import functools
import json
from typing import Any


# a request's spec is read at the edge, again by the scheduler, then served
@functools.lru_cache(maxsize=256)
def structural_tag_grammar(spec: str) -> str:
    """The Lark grammar (llguidance's dialect) of a structural_tag spec; ValueError naming what is
    wrong."""

    def bad(what: str) -> ValueError:
        return ValueError(f"sampling parameter structural_tag {what}")

    try:
        tag = json.loads(spec)
    except (TypeError, ValueError) as e:
        raise bad(f"must be a JSON string: {e}") from None
    if not isinstance(tag, dict):
        raise bad("must be a JSON object")
    if "format" in tag:
        raise bad(
            'in the {"format": ...} form is not supported; '
            'give {"structures": [...], "triggers": [...]}'
        )
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not (
        isinstance(structures, list)
        and structures
        and isinstance(triggers, list)
        and triggers
        and all(isinstance(t, str) and t for t in triggers)
    ):
        raise bad("needs a non-empty list of structures and a non-empty list of trigger strings")
    try:
        from llguidance import StructTag
    except ImportError:
        raise bad("needs the llguidance grammar backend: pip install llguidance") from None

    tags = []
    for i, s in enumerate(structures):
        if not (
            isinstance(s, dict)
            and isinstance(s.get("begin"), str)
            and isinstance(s.get("end"), str)
            and isinstance(s.get("schema"), (dict, bool))
        ):
            raise bad(f"structures[{i}] needs string begin and end and a JSON schema")
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise bad(f"structures[{i}].begin {s['begin']!r} starts with none of the triggers")
        schema: Any = s["schema"] if isinstance(s["schema"], dict) else {}
        tags.append(StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
    return StructTag.to_grammar(tags, assume_special=False)
