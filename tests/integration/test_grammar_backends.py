"""The second grammar backend (llguidance), context-free grammars (`ebnf`) and json_object as real JSON,
on the real model.

Truth: `jsonschema` for schema output (test_constrained.py's 35+ schemas, now under llguidance), an
independent Lark parser (the `lark` package) for ebnf output, `json.loads` for json_object, and the
outlines backend's own output for a batch that mixes backends. Jump-forward on == off, token for token.
"""

import json

import pytest
from test_constrained import CONTEXTS, MAX_NEW_TOKENS, SCHEMAS, SUITE, SUITE_NAMES, chat, validator

from radixrt import Engine

pytestmark = pytest.mark.integration
llguidance = pytest.importorskip(
    "llguidance", reason="the llguidance backend needs pip install llguidance"
)
lark = pytest.importorskip("lark", reason="the ebnf checks parse with lark (pip install lark)")


# GBNF (SGLang's ebnf) grammars and the same languages in Lark for the independent parser
GRAMMARS = {
    "arithmetic": (
        'root ::= expr\nexpr ::= term (op term)? (op term)? (op term)?\nop ::= "+" | "-" | "*"\n'
        'term ::= num | "(" num op num ")"\nnum ::= [0-9] [0-9]?',
        'start: expr\nexpr: term (op term)? (op term)? (op term)?\nop: "+" | "-" | "*"\n'
        'term: NUM | "(" NUM op NUM ")"\nNUM: /[0-9][0-9]?/',
    ),
    "sql": (
        'root ::= "SELECT " cols " FROM " name (" WHERE " name " = " [0-9]+)? ";"\n'
        'cols ::= name (", " name)*\nname ::= [a-z]+',
        'start: "SELECT " cols " FROM " NAME (" WHERE " NAME " = " /[0-9]+/)? ";"\ncols: NAME (", " NAME)*\n'
        "NAME: /[a-z]+/",
    ),
    "nested_lists": (
        'root ::= list\nlist ::= "[" (item ("," item)*)? "]"\nitem ::= list | [a-z]',
        'start: list\nlist: "[" (item ("," item)*)? "]"\nitem: list | /[a-z]/',
    ),
}


@pytest.fixture(scope="module")
def engines():
    llg = Engine(dtype="float32", grammar_backend="llguidance")
    yield {"llguidance": llg}
    llg.shutdown()


def test_schemas_give_valid_json_under_llguidance(engines):
    engine = engines["llguidance"]
    schemas = {**SCHEMAS, **{n: SUITE[n][0] for n in SUITE_NAMES}}
    backend = engine.scheduler.grammar_backend("json_schema")
    refused = []
    # llguidance refuses what it does not implement, by name
    for name, schema in list(schemas.items()):
        try:
            backend.validate("json_schema", json.dumps(schema))
        except ValueError as e:
            refused.append((name, str(e)[:80]))
            del schemas[name]
    assert len(refused) <= 3, refused
    assert len(schemas) >= 30
    prompts = [
        chat(
            engine.tokenizer,
            (f"{CONTEXTS[n]}\n" if n in CONTEXTS else "")
            + f"Reply with a JSON object for this schema:\n{json.dumps(s)}",
        )
        for n, s in schemas.items()
    ]
    params = [
        {"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
        for s in schemas.values()
    ]
    outs = engine.generate(prompts, params)
    finished = 0
    for (name, schema), out in zip(schemas.items(), outs):
        if out["meta_info"]["finish_reason"]["type"] != "stop":
            continue  # cut by max_new_tokens (llguidance is not budget-steered): nothing to validate
        finished += 1
        value = json.loads(out["text"])
        errors = [e.message for e in validator(schema).iter_errors(value)]
        assert not errors, f"{name}: {out['text']!r} violates the schema: {errors}"
    assert finished >= 0.8 * len(schemas), f"only {finished}/{len(schemas)} finished"
    engine.check_integrity()


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_ebnf_output_parses_with_an_independent_parser(engines, name):
    gbnf, lark_grammar = GRAMMARS[name]
    parser = lark.Lark(lark_grammar, parser="earley")
    # sql: the default backend routes
    engine = Engine(dtype="float32") if name == "sql" else engines["llguidance"]
    try:
        prompt = chat(engine.tokenizer, f"Write one short example ({name}).")
        parsed = 0
        for seed in range(3):
            out = engine.generate(
                prompt, {"ebnf": gbnf, "max_new_tokens": 48, "temperature": 0.9, "seed": seed}
            )
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                parser.parse(out["text"])  # raises on anything outside the language
                parsed += 1
            else:  # cut short: still a prefix of the language (the grammar never let it leave)
                assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert parsed >= 1, f"no {name} sample finished, so none was checked"
    finally:
        if name == "sql":
            engine.shutdown()


def test_json_object_is_real_json_at_any_depth(engines):
    from radixrt.runtime.serving.openai_api.openai_sampling import JSON_OBJECT_LARK

    engine = engines["llguidance"]
    prompts = [
        "A deeply nested JSON object describing a company, its departments, teams and members:",
        "A JSON object whose values are arrays of arrays of numbers:",
        'Reply with exactly {"a": {"b": {"c": 1}}, "d": [1, [2]]} and nothing else:',
    ]
    outs = engine.generate(
        [chat(engine.tokenizer, p) for p in prompts],
        {"ebnf": JSON_OBJECT_LARK, "max_new_tokens": 200, "temperature": 0},
    )
    depths = []
    for out in outs:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            value = json.loads(out["text"])
            assert isinstance(value, dict)
            depths.append(_depth(value))
    assert depths and max(depths) >= 3, [o["text"][:120] for o in outs]


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def test_jump_forward_on_equals_off_under_llguidance(engines):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "kind": {"enum": ["cat", "dog", "fish"]},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        },
        "required": ["name", "kind", "legs"],
        "additionalProperties": False,
    }
    off = Engine(dtype="float32", grammar_backend="llguidance", enable_jump_forward=False)
    try:
        prompts = [chat(off.tokenizer, f"Describe pet number {i} as JSON.") for i in range(4)]
        params = {"json_schema": json.dumps(schema), "max_new_tokens": 64, "temperature": 0}
        a = engines["llguidance"].generate(prompts, params)
        b = off.generate(prompts, params)
        assert [o["output_ids"] for o in a] == [o["output_ids"] for o in b]
        drafted = engines["llguidance"].get_server_info()["jump_forward_draft_tokens"]
        assert drafted > 0 and off.get_server_info()["jump_forward_draft_tokens"] == 0
    finally:
        off.shutdown()


def test_a_batch_mixing_backends_keeps_each_guarantee():
    # outlines by default; ebnf goes to llguidance in the same batch
    engine = Engine(dtype="float32")
    try:
        prompt = chat(engine.tokenizer, "Give an example.")
        params = [
            {"regex": r"[0-9]{3}-[0-9]{4}", "max_new_tokens": 16, "temperature": 0},
            {"ebnf": GRAMMARS["nested_lists"][0], "max_new_tokens": 24, "temperature": 0},
            {"max_new_tokens": 8, "temperature": 0},
            {"choices": ["alpha", "beta"], "temperature": 0},
        ]
        outs = engine.generate([prompt] * 4, params)
        import re

        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", outs[0]["text"])
        if outs[1]["meta_info"]["finish_reason"]["type"] == "stop":
            lark.Lark(GRAMMARS["nested_lists"][1]).parse(outs[1]["text"])
        assert outs[3]["text"] in ("alpha", "beta")
        alone = engine.generate(prompt, params[0])
        assert alone["output_ids"] == outs[0]["output_ids"]
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_bad_grammars_are_refused_by_name(engines):
    engine = engines["llguidance"]
    for params in ({"ebnf": "root ::= (unclosed"}, {"ebnf": ""}, {"regex": "[a-"}):
        with pytest.raises(ValueError):
            engine.generate("x", {**params, "max_new_tokens": 4})
    assert engine.generate("x", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("max_depth", [1, 2, 3])
def test_json_object_depth_is_bounded_by_the_flag(tokenizer, max_depth):
    """Truth: each object's nesting depth computed by _depth (the object is level 1)."""
    import llguidance.hf
    from llguidance.gbnf_to_lark import any_to_lark

    from radixrt.runtime.serving.openai_api.openai_sampling import json_object_grammar

    llt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(json_object_grammar(max_depth)))
    for obj in (
        {},
        {"a": 1},
        {"a": {"b": 1}},
        {"a": [1, [2]]},
        {"a": {"b": {"c": 1}}},
        {"x": [[[1]]]},
    ):
        matcher = llguidance.LLMatcher(llt, grammar, log_level=0)
        ids = tokenizer.encode(json.dumps(obj), add_special_tokens=False)
        accepted = all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()
        assert accepted == (max(_depth(obj), 1) <= max_depth), (obj, max_depth)


# short outputs (24-41 tokens) and quick outlines shadows: the test stays short
XGRAMMAR_SCHEMAS = ["event", "weather", "review"]
WEATHER_TAG = {
    "type": "structural_tag",
    "triggers": ["<f="],
    "structures": [{"begin": "<f=w>", "end": "</f>", "schema": {"enum": ["PAR-75", "LYS-69"]}}],
}


def test_xgrammar_engine_output_is_valid_for_every_kind():
    """--grammar-backend xgrammar through the real scheduler, one batch (the grammars compile side by side):
    schemas (jsonschema), a regex (re.fullmatch), choices, a GBNF grammar (lark's parser), a structural_tag
    (its Lark grammar goes to llguidance); jump-forward drafted through the real scheduler."""
    import re

    pytest.importorskip("xgrammar")
    import jsonschema

    engine = Engine(dtype="float32", grammar_backend="xgrammar")
    try:
        tok = engine.tokenizer
        schemas = {n: SCHEMAS[n] for n in XGRAMMAR_SCHEMAS}
        prompts = [
            chat(tok, f"Reply with a JSON object for this schema:\n{json.dumps(s)}")
            for s in schemas.values()
        ]
        params = [
            {"json_schema": json.dumps(s), "temperature": 0, "max_new_tokens": 64}
            for s in schemas.values()
        ]
        phone = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
        gbnf, lark_grammar = GRAMMARS["arithmetic"]
        prompts += [
            chat(tok, "A phone number:"),
            chat(tok, "Pick one."),
            chat(tok, "A sum:"),
            "Q: weather?\nA: <f=w>",
        ]
        params += [
            {"regex": phone, "temperature": 0, "max_new_tokens": 24},
            {"choices": ["red", "green", "blue"], "temperature": 0},
            {"ebnf": gbnf, "temperature": 0, "max_new_tokens": 24},
            {"structural_tag": json.dumps(WEATHER_TAG), "temperature": 0, "max_new_tokens": 24},
        ]
        outs = engine.generate(prompts, params)
        for (name, schema), out in zip(schemas.items(), outs):
            # budget-steered: a valid ending fits in 64 tokens, so the output is complete
            assert out["meta_info"]["finish_reason"]["type"] == "stop", (name, out["text"])
            jsonschema.validate(json.loads(out["text"]), schema)
        regex_out, choice_out, ebnf_out, tag_out = outs[len(schemas) :]
        assert re.fullmatch(phone, regex_out["text"]), regex_out["text"]
        assert choice_out["text"] in ("red", "green", "blue")
        assert ebnf_out["meta_info"]["finish_reason"]["type"] == "stop", ebnf_out["text"]
        lark.Lark(lark_grammar, parser="earley").parse(ebnf_out["text"])
        for call in re.findall(r"<f=w>(.*?)</f>", tag_out["text"], re.S):
            assert json.loads(call) in ("PAR-75", "LYS-69"), tag_out["text"]
        assert engine.get_server_info()["jump_forward_draft_tokens"] > 0
        with pytest.raises(ValueError, match="unclosed"):
            engine.generate("x", {"ebnf": "root ::= (unclosed", "max_new_tokens": 4})
        engine.check_integrity()
    finally:
        engine.shutdown()
