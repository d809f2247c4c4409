"""JSON extraction with a schema: the output is guaranteed to parse and validate.

python examples/json_extraction.py [--url http://127.0.0.1:30000]
"""

import json

from example_backend import parse_args

import radixrt as sgl

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 32},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

TEXTS = [
    "Maria Lopez, 34, moved to Lisbon last spring to work as an architect.",
    "At 71 years old, Kenji Sato still runs a small bakery in Osaka.",
]


@sgl.function
def extract(s, text):
    s += sgl.user("Extract the person's name, age and city as JSON.\n\nText: " + text)
    s += sgl.assistant(sgl.gen("json", max_tokens=64, json_schema=SCHEMA))


def main() -> None:
    parse_args(__doc__)
    for text, state in zip(TEXTS, extract.run_batch([{"text": t} for t in TEXTS], temperature=0)):
        record = json.loads(state["json"])
        print(f"{text}\n  -> {record}")


if __name__ == "__main__":
    main()
