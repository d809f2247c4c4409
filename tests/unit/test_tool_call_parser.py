"""The Hermes-envelope parser (tool_parsers.ToolCallParser, what a grammar writes): any split of an
output into deltas gives the same content and calls as the whole text, and those are exactly what
the output was built from (an independent builder, json.loads)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.serving.openai_api.tool_parsers import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Content,
    ToolCallParser,
    parse_all,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
args_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,12}", fullmatch=True)
content = st.text(alphabet=st.sampled_from(list('ab <>/}{\n"tool_call')), max_size=20).filter(
    lambda t: "<tool_call>" not in t
)


@st.composite
def outputs(draw):
    """(text, content, calls): content first, then calls in the fallback format, maybe pretty-printed."""
    text = expected_content = draw(content)
    calls = []
    for _ in range(draw(st.integers(0, 3))):
        name, args = (
            draw(names),
            json.dumps(draw(args_objects), indent=draw(st.sampled_from([None, 1]))),
        )
        sep = draw(st.sampled_from(["", "\n", " "]))
        if not calls:  # whitespace between two calls only separates them: it is not content
            expected_content += sep
        text += (
            f'{sep}<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'
        )
        calls.append((name, args))
    return text, expected_content, calls


def feed_split(text: str, cuts: list[int]) -> list:
    parser = ToolCallParser()
    events, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        events += parser.feed(text[last:c])
        last = c
    return events + parser.finish()


def merged(events: list) -> list:
    """Adjacent fragments of the same kind joined: the split-independent form of an event list."""
    out = []
    for e in events:
        if out and type(e) is type(out[-1]) and isinstance(e, Content):
            out[-1] = Content(out[-1].text + e.text)
        elif (
            out
            and isinstance(e, ArgsDelta)
            and isinstance(out[-1], ArgsDelta)
            and e.index == out[-1].index
        ):
            out[-1] = ArgsDelta(e.index, out[-1].text + e.text)
        else:
            out.append(e)
    return out


@settings(max_examples=400, deadline=None)
@given(data=outputs(), cuts=st.lists(st.integers(0, 400), max_size=30))
def test_any_split_gives_the_same_calls(data, cuts):
    text, expected_content, calls = data
    whole = merged(feed_split(text, []))
    split = feed_split(text, [c for c in cuts if c <= len(text)])
    assert merged(split) == whole
    got_content, got_calls = parse_all(text)
    assert got_calls == calls
    assert [json.loads(a) for _, a in got_calls] == [json.loads(a) for _, a in calls]
    assert got_content == expected_content
    starts = [e for e in split if isinstance(e, CallStart)]
    assert [e.index for e in starts] == list(range(len(calls)))
    assert [e.index for e in split if isinstance(e, CallEnd)] == list(range(len(calls)))


@given(text=content, cuts=st.lists(st.integers(0, 40), max_size=10))
def test_plain_text_is_all_content(text, cuts):
    events = feed_split(text, [c for c in cuts if c <= len(text)])
    assert all(isinstance(e, Content) for e in events) and "".join(e.text for e in events) == text


def test_streamed_arguments_never_take_back():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": {"b": "}"}, "c": [1]}}\n</tool_call>'
    parser, sent = ToolCallParser(), ""
    for ch in text:
        for e in parser.feed(ch):
            if isinstance(e, ArgsDelta):
                sent += e.text
                assert '{"a": {"b": "}"}, "c": [1]}'.startswith(sent)
    assert sent == '{"a": {"b": "}"}, "c": [1]}'


def test_cut_call_keeps_what_was_sent():
    events = feed_split('Sure.<tool_call>\n{"name": "f", "arguments": {"a": 1', [3, 9, 30])
    assert merged(events) == [Content("Sure."), CallStart(0, "f"), ArgsDelta(0, '{"a": 1')]


def test_close_tag_inside_a_string_argument_does_not_end_the_call():
    text = (
        '<tool_call>\n{"name": "f", "arguments": {"s": "x</tool_call>y"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>\n'
    )
    content, calls = parse_all(text)
    assert calls == [("f", '{"s": "x</tool_call>y"}'), ("g", "{}")] and content == ""
    for cut in range(len(text)):
        assert merged(feed_split(text, [cut])) == merged(feed_split(text, []))


def test_a_long_run_of_spaces_costs_linear_time():
    """#56: the parser runs on the event loop, once per streamed piece. A grammar can force an
    argument of thousands of spaces; a parser that re-reads what it holds on every piece (the old
    trailing-text regex searched the run from each of its positions: O(w^2) a piece) froze the loop
    for seconds. 100,000 spaces and then a letter, in 16-character pieces: linear work is well
    under a second of this thread's CPU; the old parser needed hours."""
    import time

    spaces = " " * 100_000
    text = f'<tool_call>\n{{"name": "f", "arguments": {{"s": "{spaces}x"}}}}\n</tool_call>'
    started = time.thread_time()
    events = feed_split(text, list(range(0, len(text), 16)))
    took = time.thread_time() - started
    args = "".join(e.text for e in events if isinstance(e, ArgsDelta))
    assert json.loads(args) == {"s": spaces + "x"}
    assert [type(e) for e in events if not isinstance(e, ArgsDelta)] == [CallStart, CallEnd]
    assert took < 2.0, f"{took:.2f} s of CPU for one call's arguments"
