"""The xgrammar backend (constrained/xgrammar_backend.py, xgrammar_state.py, xgrammar_compile.py) on the
default model's real tokenizer, judged by truths that share no code with xgrammar:

- masks: a token is allowed iff its decoded text keeps the output a prefix of some match (the `regex`
  package's partial fullmatch), EOS iff the output is a full match (`re.fullmatch`), never an id past the
  tokenizer or a special token;
- schemas: `jsonschema` on fake-model outputs, the test suite's invalid instances never accepted;
- drafts: a prefix of the forced text found by a single-byte automaton (ByteFSM) of the same regex, spelled
  by the tokenizer's own encoding, the masks along them those of a state that took the tokens one by one,
  and greedy decoding with drafts == without;
- ebnf: `lark`'s own Earley parser on the output;
- a compile past its time limit is a clear error within the limit, a bad grammar a GrammarError naming it.
"""

from __future__ import annotations

import json
import random
import re
import time

import pytest
import regex as partial_re
import torch
from test_budget_steering import UNBOUNDED, decode
from test_grammar import JUMP_SCHEMA, compiled, greedy, masked_argmax
from test_grammar_fallback import FakeBackend
from test_json_schema_regex import SUITE, ByteFSM, validator

from radixrt.runtime.constrained.backend import GrammarBackend
from radixrt.runtime.constrained.choose import BackendChooser, ByDialect
from radixrt.runtime.constrained.compile_pool import TransientGrammarError
from radixrt.runtime.constrained.fallback import FallbackBackend
from radixrt.runtime.constrained.regex_builder import GrammarError
from radixrt.runtime.constrained.state import fill_masks
from radixrt.runtime.constrained.vocab import special_token_ids

pytest.importorskip("xgrammar")
from radixrt.runtime.constrained.xgrammar_backend import XGrammarBackend  # noqa: E402

EXTRA_IDS = 64  # logits wider than the tokenizer (a padded embedding)


@pytest.fixture(scope="module")
def vocab_size(tokenizer):
    return len(tokenizer) + EXTRA_IDS


@pytest.fixture(scope="module")
def xgr(tokenizer, vocab_size):
    be = XGrammarBackend(tokenizer, vocab_size, [tokenizer.eos_token_id], compile_timeout=60.0)
    yield be
    be.shutdown()


@pytest.fixture(scope="module")
def spelled(xgr):
    """id -> the text it appends (xgrammar's decoded vocabulary, bytes decoded as the output is);
    the padding ids past the tokenizer spell nothing and are no tokens."""
    return {i: b.decode("utf-8", "replace") for i, b in enumerate(xgr.forced.spelling) if b}


def allowed_ids(state, vocab_size) -> set[int]:
    return set(fill_masks([state], vocab_size, "cpu")[0].nonzero().flatten().tolist())


MASK_REGEXES = [r"[0-9]{3}-[a-z]+", r"(yes|no|maybe)", r"a(bc)*d?", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"]


@pytest.mark.parametrize("rx", MASK_REGEXES)
def test_masks_allow_exactly_the_tokens_that_stay_a_prefix(xgr, tokenizer, vocab_size, spelled, rx):
    eos, special = tokenizer.eos_token_id, special_token_ids(tokenizer)
    pattern = partial_re.compile(rx)
    rng = random.Random(rx)
    checked = 0
    for _ in range(2):
        state, text = compiled(xgr, "regex", rx), ""
        for _ in range(6):
            allowed = allowed_ids(state, vocab_size)
            assert (eos in allowed) == bool(re.fullmatch(rx, text)), (rx, text)
            assert not any(i >= len(tokenizer) for i in allowed), "an id past the tokenizer"
            want = {
                i
                for i, t in spelled.items()
                if i not in special and pattern.fullmatch(text + t, partial=True)
            }
            assert allowed - {eos} == want, (rx, text, sorted(allowed ^ want)[:10])
            checked += 1
            choices = sorted(allowed - {eos})
            if not choices or (eos in allowed and rng.random() < 0.3):
                break
            tok = rng.choice(choices)
            state.accept(tok)
            text += spelled[tok]
        assert state.is_final() == bool(re.fullmatch(rx, text))
    assert checked >= 4


def test_eos_ends_the_grammar_once(xgr, tokenizer, vocab_size):
    eos = tokenizer.eos_token_id
    state = compiled(xgr, "choices", ["yes", "no"])
    with pytest.raises(GrammarError):
        state.accept(eos)  # nothing matched yet
    state.accept(tokenizer.encode("yes", add_special_tokens=False)[0])
    assert state.is_final() and state.is_terminated()  # nothing may follow "yes"
    assert allowed_ids(state, vocab_size) == {eos}
    state.accept(eos)
    assert state.ended and allowed_ids(state, vocab_size) == set()
    with pytest.raises(GrammarError):
        state.accept(eos)


def schema_names(xgr):
    """The suite's schemas xgrammar takes, and the refusals (each names its reason)."""
    taken, refused = [], {}
    for name, (schema, _, _) in SUITE.items():
        try:
            xgr.validate("json_schema", json.dumps(schema))
            taken.append(name)
        except GrammarError as e:
            refused[name] = str(e)
    return taken, refused


def accepts(xgr, tokenizer, schema, text) -> bool:
    state = compiled(xgr, "json_schema", schema)
    try:
        for t in tokenizer.encode(text, add_special_tokens=False):
            state.accept(t)
    except GrammarError:
        return False
    return state.is_final()


def test_suite_schemas_are_sound_and_their_outputs_valid(xgr, tokenizer, vocab_size):
    taken, refused = schema_names(xgr)
    assert len(taken) >= 25, refused
    # what xgrammar would silently widen is refused by name
    for name in ("not_type", "dependent_required", "enum_with_type"):
        assert name in refused, name
    assert "'not'" in refused["not_type"]
    eos = tokenizer.eos_token_id
    finished = 0
    for name in taken:
        schema, valid, invalid = SUITE[name]
        for text in invalid:
            assert not accepts(xgr, tokenizer, schema, text), f"{name}: accepted invalid {text!r}"
        state, out = compiled(xgr, "json_schema", schema), []
        while len(out) < 120 and not state.is_terminated():
            tok = masked_argmax([3] + out, state, vocab_size)
            state.accept(tok)
            out.append(tok)
        if not state.is_final():
            continue  # the fake model rambled past the budget: nothing to validate
        finished += 1
        value = json.loads(tokenizer.decode([t for t in out if t != eos]))
        errors = [e.message for e in validator(schema).iter_errors(value)]
        assert not errors, (name, value, errors)
    assert finished >= 0.7 * len(taken), f"only {finished} of {len(taken)} outputs finished"


def test_whitespace_is_the_other_backends_rule(xgr, tokenizer):
    schema = SUITE["flat_required"][0]
    assert accepts(xgr, tokenizer, schema, '{"name":"a","age":1}')
    assert accepts(xgr, tokenizer, schema, '{ "name" : "a" , "age" : 1 }')
    assert not accepts(xgr, tokenizer, schema, '{"name":"a",  "age":1}')  # "[ ]?": one space
    assert not accepts(xgr, tokenizer, schema, '{"name":"a",\n"age":1}')
    assert not accepts(xgr, tokenizer, schema, '{"name":"a","age":1,"x":2}')  # strict


def byte_forced(fsm: ByteFSM, text: bytes) -> bytes:
    """Forced bytes after `text`: the single-byte automaton has one way on and is not accepting."""
    state = fsm.index.get_initial_state()
    for b in text:
        state = fsm.trans[state][b]
    out = bytearray()
    while True:
        ways = fsm.trans.get(state, {})
        if len(ways) != 1 or 1 in ways:
            return bytes(out)
        ((b, state),) = ways.items()
        out.append(b)


DRAFT_REGEXES = [
    r'\{"classification":"(positive|negative)_sentiment","score":[0-9]\}',
    r"(supercalifragilistic|xylophone) (expialidocious|music)!",
    r"The answer is: [0-9]+\.",
]


@pytest.mark.parametrize("rx", DRAFT_REGEXES)
def test_drafts_are_the_forced_text_tokenized(xgr, tokenizer, vocab_size, spelled, rx):
    fsm = ByteFSM(rx)
    rng = random.Random(rx)
    eos = tokenizer.eos_token_id
    num_drafted = 0
    for _ in range(3):
        state, history, text = compiled(xgr, "regex", rx), [], b""
        while not state.is_terminated() and len(history) < 40:
            truth = byte_forced(fsm, text)
            draft, positions = state.draft(100)
            drafted = "".join(spelled[t] for t in draft).encode()
            assert truth.startswith(drafted), (rx, text, truth, drafted)
            # the tokenizer's own encoding of the forced text, less at most its last token
            encoded = tokenizer.encode(truth.decode(), add_special_tokens=False)
            assert draft == encoded[: len(draft)] and len(draft) >= min(len(encoded), 16) - 1
            walker = compiled(xgr, "regex", rx)
            for t in history:
                walker.accept(t)
            for t, pos in zip(draft, positions):
                assert t in allowed_ids(walker, vocab_size), "a draft token is not allowed there"
                walker.accept(t)
                assert torch.equal(
                    fill_masks([walker], vocab_size, "cpu")[0],
                    fill_masks([state.at(pos, 1 << 20)], vocab_size, "cpu")[0],
                )
                assert state.ends_at(pos) == walker.is_terminated()
            num_drafted += len(draft)
            allowed = sorted(allowed_ids(state, vocab_size) - {eos})
            if not allowed:
                break
            tok = rng.choice(allowed)
            state.accept(tok)
            history.append(tok)
            text += spelled[tok].encode()
    assert num_drafted > 0, "no draft along any walk: the comparison says nothing"


def test_draft_respects_max_tokens_and_off_switch(tokenizer, vocab_size, xgr):
    off = XGrammarBackend(
        tokenizer, vocab_size, [tokenizer.eos_token_id], enable_jump_forward=False
    )
    try:
        spec = ["supercalifragilistic", "xylophone"]
        a, b = compiled(xgr, "choices", spec), compiled(off, "choices", spec, timeout=60)
        assert a.draft(100) == ([], [])  # "s" or "x": nothing is forced yet
        first = tokenizer.encode(spec[0], add_special_tokens=False)[0]
        a.accept(first)
        b.accept(first)
        long_draft, _ = a.draft(100)
        assert long_draft and a.draft(1)[0] == long_draft[:1] and a.draft(0) == ([], [])
        assert b.draft(100) == ([], [])
        a.accept(long_draft[0])  # a draft walk leaves the matcher where it was
    finally:
        off.shutdown()


def test_jump_forward_equals_plain_greedy(xgr, tokenizer, vocab_size):
    spec = JUMP_SCHEMA
    eos, saved = tokenizer.eos_token_id, 0
    for prefix in ([], [5], [7, 9]):
        on, forwards_on = greedy(xgr, spec, vocab_size, eos, jump=True, prefix=prefix)
        off, forwards_off = greedy(xgr, spec, vocab_size, eos, jump=False, prefix=prefix)
        assert on == off
        saved += forwards_off - forwards_on
        json.loads(tokenizer.decode([t for t in on if t != eos]))
    assert saved > 0


def test_fork_goes_its_own_way(xgr, tokenizer, vocab_size, spelled):
    state = compiled(xgr, "regex", r"(ab|ac)[0-9]")
    state.accept(tokenizer.encode("a", add_special_tokens=False)[0])
    twin = state.fork([])
    state.accept(tokenizer.encode("b", add_special_tokens=False)[0])
    assert {spelled[t] for t in allowed_ids(twin, vocab_size)} == {"b", "c"}
    assert all(spelled[t].isdigit() for t in allowed_ids(state, vocab_size))


GBNF = 'root ::= "[" (item ("," item)*)? "]"\nitem ::= "[" (item ("," item)*)? "]" | [a-z]'
LARK = 'start: list\nlist: "[" (item ("," item)*)? "]"\nitem: list | /[a-z]/'


def test_ebnf_output_parses_with_lark(xgr, tokenizer, vocab_size):
    lark = pytest.importorskip("lark")
    parser = lark.Lark(LARK, parser="earley")
    eos, parsed = tokenizer.eos_token_id, 0
    for prefix in ([1], [2], [3], [4]):
        state, out = compiled(xgr, "ebnf", GBNF), []
        while len(out) < 60 and not state.is_terminated():
            tok = masked_argmax(prefix + out, state, vocab_size)
            state.accept(tok)
            out.append(tok)
        if state.is_final():
            parser.parse(tokenizer.decode([t for t in out if t != eos]))
            parsed += 1
    assert parsed >= 1


@pytest.mark.parametrize(
    "kind,spec,named",
    [
        ("ebnf", "root ::= (unclosed", "unclosed"),
        ("ebnf", 'start: "a"', "EBNF"),  # Lark is llguidance's dialect, not xgrammar's
        ("regex", "[a-", "[a-"),
        ("json_schema", {"type": "array", "uniqueItems": True}, "uniqueItems"),
        ("json_schema", {"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ("json_schema", {"$ref": "#/$defs/x", "$defs": {"x": {}}, "minimum": 3}, "minimum"),
    ],
)
def test_bad_grammars_are_refused_by_name(xgr, kind, spec, named):
    with pytest.raises(GrammarError, match=re.escape(named)):
        xgr.validate(kind, spec if isinstance(spec, str) else json.dumps(spec))
    with pytest.raises(GrammarError, match=re.escape(named)):
        compiled(xgr, kind, spec if isinstance(spec, str) else json.dumps(spec))


def test_a_slow_compile_is_stopped_with_a_clear_error(tokenizer, vocab_size):
    # 3 s: ample for a small grammar on a niced worker of a busy machine
    be = XGrammarBackend(tokenizer, vocab_size, [tokenizer.eos_token_id], compile_timeout=3.0)
    try:
        compiled(be, "regex", "[a-z]", timeout=60)  # the worker is up (its start is not timed)
        start = time.monotonic()
        # a chain of 30,000 rules: xgrammar's compile grows faster than linearly (6,000 take ~5 s)
        chain = "\n".join(f'r{i} ::= "k{i}" [a-z]* r{i + 1} | [0-9]+' for i in range(30_000))
        fut = be.request("ebnf", f'root ::= r0\n{chain}\nr30000 ::= "end"')
        while not fut.done():
            assert time.monotonic() - start < 30, "the compile was not stopped"
            time.sleep(0.02)
        with pytest.raises(TransientGrammarError, match="ebnf grammar took longer than 3 s"):
            fut.result()
        assert be.pool.num_killed == 1
        assert compiled(be, "regex", "[0-9]", timeout=60).is_final() is False  # serves on
    finally:
        be.shutdown()


def test_compiled_grammars_are_cached_and_shared(xgr):
    spec = {"type": "object", "properties": {"probe": {"type": "boolean"}}, "required": ["probe"]}
    f1, f2 = xgr.request("json_schema", spec), xgr.request("json_schema", json.dumps(spec))
    s1 = compiled(xgr, "json_schema", spec)
    assert f1._future is f2._future  # one compile for both
    f3 = xgr.request("json_schema", spec)
    assert f3.done() and f3.result() is not s1 and xgr.cached_bytes > 0


def test_the_chooser_serves_every_kind_with_xgrammar_steered():
    made = {}

    def make(name):
        made[name] = FakeBackend(name)
        return made[name]

    chooser = BackendChooser("xgrammar", make)
    for kind in ("json_schema", "regex", "choices", "tool_call_grammar", "json_object"):
        be = chooser.for_kind(kind)
        assert isinstance(be, FallbackBackend) and be.primary is made["xgrammar"]
        assert be.secondary is made["outlines"] and be.shadow and not be.fallback
    ebnf = chooser.for_kind("ebnf")
    assert isinstance(ebnf, ByDialect)
    ebnf.validate("ebnf", GBNF)
    assert made["xgrammar"].calls[-1] == ("validate", GBNF) and "llguidance" not in made
    ebnf.validate("ebnf", LARK)  # structural_tag's and json_object's grammars are Lark
    assert made["llguidance"].calls[-1] == ("validate", LARK)
    with pytest.raises(ValueError, match="xgrammar"):
        BackendChooser("xgrammr", make)


@pytest.fixture(scope="module")
def steered(tokenizer, xgr):
    """--grammar-backend xgrammar as choose.py builds it: an outlines shadow steers."""
    outlines = GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield FallbackBackend(xgr, outlines, shadow=True, fallback=False)
    outlines.shutdown()


@pytest.mark.parametrize("name", ["free_string", "int_array"])
def test_xgrammar_requests_are_steered_to_a_valid_end(steered, tokenizer, name):
    spec = json.dumps(UNBOUNDED[name])
    eos = tokenizer.eos_token_id
    for budget in (12, 25):
        state = compiled(steered, "json_schema", spec)
        assert type(state).__name__ == "XGrammarState" and state.shadow is not None
        out = decode(state, tokenizer.encode(f"{name}:"), len(tokenizer), eos, budget)
        assert state.shadow.current() is not None, "the shadow was lost"
        assert state.is_final(), f"{name}: budget {budget} but the output is incomplete"
        value = json.loads(tokenizer.decode([t for t in out if t != eos]))
        assert not list(validator(UNBOUNDED[name]).iter_errors(value))
