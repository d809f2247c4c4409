"""The --tool-call-parser formats: every split of an output gives the same events as the whole text,
the calls are exactly those the text was built from (an independent builder per format, compared
as parsed JSON), content around calls is kept, and anything that is not a well-formed call (broken
JSON, an unknown tool, a pythonic expression that is not a literal) is content, never executed."""

import builtins
import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.serving.openai_api.tool_parsers import (
    PARSERS,
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    make_parser,
    parse_all,
)

FORMATS = ["hermes", "llama3", "mistral", "pythonic"]
TRICKY = list("ab ,()[]{}'\"\\:;=\n") + ["</tool_call>", "[ARGS]", "é"]
strings = st.lists(st.sampled_from(TRICKY), max_size=6).map("".join)
scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | strings
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=8,
)
idents = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("true", "false", "null")
)
args_objects = st.dictionaries(idents, json_values, max_size=4)
calls_st = st.lists(st.tuples(idents, args_objects), min_size=1, max_size=3)
words = st.text(alphabet="abc .,!?\n", max_size=12)


def feed_split(name: str, text: str, cuts: list[int], names=None) -> list:
    parser = make_parser(name, names)
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[last:c])
        last = c
    return events + parser.finish()


def merged(events: list) -> list:
    """Adjacent content fragments joined: the split-independent form of an event list."""
    out = []
    for e in events:
        if out and isinstance(e, Content) and isinstance(out[-1], Content):
            out[-1] = Content(out[-1].text + e.text)
        else:
            out.append(e)
    return out


def check(name: str, text: str, content: str, calls: list, cuts=(), names=None) -> None:
    """text read whole, at every single split point and at `cuts` gives content and calls (compared
    as parsed JSON), with well-ordered events."""
    whole = merged(feed_split(name, text, [], names))
    for cut in range(1, len(text)):
        assert merged(feed_split(name, text, [cut], names)) == whole, cut
    assert merged(feed_split(name, text, [c for c in cuts if c < len(text)], names)) == whole
    got_content, got_calls = parse_all(text, make_parser(name, names))
    assert got_content == content
    assert [(n, json.loads(a)) for n, a in got_calls] == [(n, a) for n, a in calls]
    assert [e.index for e in whole if isinstance(e, CallStart)] == list(range(len(calls)))
    assert [e.index for e in whole if isinstance(e, CallEnd)] == list(range(len(calls)))


# independent builders: (name, args) -> the format's text
def hermes(calls):
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls
    )


def llama3(calls):
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def mistral(calls):
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


def py_literal(v):
    if isinstance(v, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(py_literal(x) for x in v) + "]"
    return repr(v)


def pythonic(calls):
    return (
        "["
        + ", ".join(
            n + "(" + ", ".join(f"{k}={py_literal(v)}" for k, v in a.items()) + ")"
            for n, a in calls
        )
        + "]"
    )


@settings(max_examples=150, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    calls=calls_st,
    before=words,
    cuts=st.lists(st.integers(0, 600), max_size=20),
)
def test_every_format_reads_back_what_it_was_built_from(fmt, calls, before, cuts):
    if fmt == "llama3":  # calls open the output, or follow <|python_tag|>
        prefix = f"{before}<|python_tag|>" if before.strip() else ""
        text, content = prefix + llama3(calls), before if prefix else ""
    else:
        text = before + {"hermes": hermes, "mistral": mistral, "pythonic": pythonic}[fmt](calls)
        content = before
    whole = merged(feed_split(fmt, text, []))
    assert merged(feed_split(fmt, text, cuts)) == whole
    got_content, got_calls = parse_all(text, make_parser(fmt))
    assert got_content == content
    assert [(n, json.loads(a)) for n, a in got_calls] == calls


@pytest.mark.parametrize(
    "fmt, text, content, calls",
    [
        (
            "hermes",
            'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"unit": "celsius"}}\n</tool_call>\nand then <tool_call>\n{"name": "add", '
            '"parameters": {"a": 1, "b": 2}}\n</tool_call>\n',
            "I will check.\n\nand then ",
            [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 1, "b": 2})],
        ),
        (
            "qwen25",
            '<tool_call>\n{"name": "f", "arguments": {"s": "x</tool_call>y\\""}}\n</tool_call>',
            "",
            [("f", {"s": 'x</tool_call>y"'})],
        ),
        (
            "llama3",
            '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}};'
            '{"name": "add", "arguments": {"a": 1, "b": 2}}  ; Done.',
            "  ; Done.",
            [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 1, "b": 2})],
        ),
        (
            "llama3",
            'Let me look that up. <|python_tag|>{"name": "f", "parameters": {"q": "a}b{"}}',
            "Let me look that up. ",
            [("f", {"q": "a}b{"})],
        ),
        (
            "mistral",
            'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
            '"celsius"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]',
            "Sure. ",
            [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 1, "b": 2})],
        ),
        (
            "mistral",
            '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}then[TOOL_CALLS]f[ARGS] {"s": "]["}',
            "then",
            [("add", {"a": 1, "b": 2}), ("f", {"s": "]["})],
        ),
        (
            "mistral",  # the tag dropped as a special token: a bare array opens the output
            '\n[{"name": "f", "arguments": {}}]',
            "\n",
            [("f", {})],
        ),
        (
            "pythonic",
            "Calling [get_weather(city=\"Paris, (FR)\", unit='celsius'), add(a=1, b=-2.5, "
            "c=[1, {'k': (1, [2, 'x)]'])}], d=None, e=True, f=null, g='''a\"b''')] now [x] (y)",
            "Calling  now [x] (y)",
            [
                ("get_weather", {"city": "Paris, (FR)", "unit": "celsius"}),
                (
                    "add",
                    {
                        "a": 1,
                        "b": -2.5,
                        "c": [1, {"k": [1, [2, "x)]"]]}],
                        "d": None,
                        "e": True,
                        "f": None,
                        "g": 'a"b',
                    },
                ),
            ],
        ),
        ("pythonic", "[f()][g(s='[h(x=1)]')]", "", [("f", {}), ("g", {"s": "[h(x=1)]"})]),
    ],
)
def test_examples(fmt, text, content, calls):
    check(fmt, text, content, calls, cuts=list(range(0, len(text), 3)))


MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": }}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {}}'),  # never closed
    ("llama3", '{"name": "f", "parameters": [1]}'),
    ("llama3", '{"name": f, "parameters": {}}'),
    ("llama3", '{"city": "Paris"} and more'),
    ("llama3", 'Hi {"name": "f", "parameters": {}}'),  # not at the start: content
    ("llama3", '<|python_tag|>print("hi")'),
    ("llama3", '{"name": "f", "parameters": {"a": 1}'),  # never closed
    ("mistral", "[TOOL_CALLS] not json"),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "f", "arguments": 1}]'),
    ("mistral", '[TOOL_CALLS]f[ARGS]"x"'),
    ("mistral", "[TOOL_CALLS]f[ARX]{}"),
    ("mistral", "[1, 2, 3]"),
    ("pythonic", "[f(1)]"),
    ("pythonic", "[f(x=g())]"),
    ("pythonic", "[f(x=y)]"),
    ("pythonic", "[f(**k)]"),
    ("pythonic", "[f(x={1, 2})]"),
    ("pythonic", "[f(x=b'a')]"),
    ("pythonic", "[f(x=1 + 2)]"),
    ("pythonic", "[f(x={1: 2})]"),
    ("pythonic", '[os.system(x="ls")]'),
    ("pythonic", "[f(x=1), g(]"),
    ("pythonic", "[f(x=" + "[" * 300 + "]" * 300 + ")]"),
]


@pytest.mark.parametrize("fmt, text", MALFORMED)
def test_a_malformed_call_is_content(fmt, text):
    text = "Before. " * (fmt != "llama3") + text  # llama3 reads calls at the start only
    check(fmt, text, text, [], names=["f", "g"])


def test_pythonic_executes_nothing(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("evaluated")

    for fn in ("eval", "exec"):  # (ast.parse compiles to a tree only: never run)
        monkeypatch.setattr(builtins, fn, boom)
    marker = tmp_path / "pwned"
    text = f"[f(x=__import__('os').system('touch {marker}'))]"
    assert parse_all(text, make_parser("pythonic")) == (text, [])
    imported = "[__import__(name='os')]"
    assert parse_all(imported, make_parser("pythonic", ["f"])) == (imported, [])
    assert not marker.exists()


def test_calls_after_a_bad_one_and_text_between_calls():
    text = (
        '<tool_call>\n{"name": "f", "arguments": {oops}}\n</tool_call>\nthen '
        '<tool_call>\n{"name": "g", "arguments": {"k": [1, "</tool_call>"]}}\n</tool_call>'
        " and <tool_call>\n"
        '{"name": "f", "arguments": {}}\n</tool_call>'
    )
    bad = '<tool_call>\n{"name": "f", "arguments": {oops}}\n</tool_call>\nthen '
    check("hermes", text, bad + " and ", [("g", {"k": [1, "</tool_call>"]}), ("f", {})])


def test_every_character_fed_alone_and_cut_calls_stay_content():
    text = '[TOOL_CALLS][{"name": "f", "arguments": {"a": "[x]"}}]'
    for cut in range(len(text)):  # an output cut short (max_tokens) inside a call
        parser = make_parser("mistral")
        events = parser.feed(text[:cut]) + parser.finish()
        assert all(isinstance(e, Content) for e in events)
        assert "".join(e.text for e in events) == text[:cut]
        assert parser.in_call == (cut >= len("[TOOL_CALLS]")) and parser.num_calls == 0
    parser = make_parser("mistral")
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    assert events == [CallStart(0, "f"), ArgsDelta(0, '{"a": "[x]"}'), CallEnd(0)]
    assert not parser.in_call and parser.num_calls == 1


def test_the_flag_names_every_parser():
    field = ServerConfig.__dataclass_fields__["tool_call_parser"]
    assert field.default is None and field.metadata["choices"] == tuple(PARSERS)
    assert ServerConfig(tool_call_parser="qwen25").tool_call_parser == "qwen25"
    with pytest.raises(ValueError, match="tool_call_parser"):
        ServerConfig(tool_call_parser="nope")
