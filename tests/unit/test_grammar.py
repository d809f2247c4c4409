"""GrammarBackend on the default model's real tokenizer: byte-exact vocabulary, masks sized to the
logits, EOS exactly at accepting states, random token walks judged by `re` / `jsonschema` and by
the tokenizer's own decode, the compile timeout, the cache, and jump-forward drafts: the forced text, their
masks, and greedy decoding with draft verification == plain greedy.
"""

from __future__ import annotations

import json
import random
import re
import time

import pytest
import torch
from outlines_core import Guide
from test_json_schema_regex import SUITE, ByteFSM, validator

from radixrt.runtime.constrained.backend import GrammarBackend, GrammarError, fill_masks
from radixrt.runtime.constrained.draft import MAX_DRAFT_BYTES
from radixrt.runtime.constrained.json_schema.to_regex import schema_to_regex
from radixrt.runtime.constrained.state import HEAVY_STATE_TOKENS
from radixrt.runtime.constrained.vocab import special_token_ids, token_bytes_map

EXTRA_IDS = 64  # logits wider than the tokenizer, as when the embedding is padded


@pytest.fixture(scope="module")
def vocab_size(tokenizer):
    return len(tokenizer) + EXTRA_IDS


@pytest.fixture(scope="module")
def backend(tokenizer, vocab_size):
    return GrammarBackend(tokenizer, vocab_size, [tokenizer.eos_token_id], compile_timeout=120.0)


@pytest.fixture(scope="module")
def id_bytes(tokenizer, vocab_size):
    return {i: b for b, ids in token_bytes_map(tokenizer, vocab_size).items() for i in ids}


def compiled(backend, kind, spec, timeout=120.0):
    fut = backend.request(kind, spec)
    start = time.monotonic()
    while not fut.done():
        assert time.monotonic() - start < timeout
        time.sleep(0.005)
    return fut.result()


_DIST: dict[int, tuple[dict, dict[int, int]]] = {}


def distances(compiled) -> tuple[dict, dict[int, int]]:
    """(transitions, tokens-to-a-final-state) for every state of a compiled index (reverse BFS)."""
    if id(compiled) not in _DIST:
        trans = compiled.index.get_transitions()
        rev: dict[int, set[int]] = {}
        for s, m in trans.items():
            for d in m.values():
                rev.setdefault(d, set()).add(s)
        dist = {f: 0 for f in compiled.index.get_final_states()}
        frontier = list(dist)
        while frontier:
            nxt = []
            for d in frontier:
                for s in rev.get(d, ()):
                    if s not in dist:
                        dist[s] = dist[d] + 1
                        nxt.append(s)
            frontier = nxt
        _DIST[id(compiled)] = trans, dist
    return _DIST[id(compiled)]


def walk(state, rng, vocab_size, eos_ids, max_tokens=40):
    """Random allowed tokens (checked against the mask) until the grammar ends; past max_tokens
    head for the nearest final state and end there."""
    (trans, dist), out = distances(state.compiled), []
    while not state.is_terminated():
        mask = fill_masks([state], vocab_size, "cpu")[0]
        allowed = mask.nonzero().flatten().tolist()
        assert allowed, "no allowed token in a non-terminated state"
        eos_ok = [t for t in allowed if t in eos_ids]
        assert bool(eos_ok) == state.is_final()
        if eos_ok and (len(out) > max_tokens or rng.random() < 0.1):
            state.accept(eos_ok[0])
            break
        if len(out) > max_tokens:
            moves = [(t, d) for t, d in trans[state.guide.get_state()].items() if t not in eos_ids]
            best = min(dist[d] for _, d in moves)
            tok = rng.choice([t for t, d in moves if dist[d] == best])
        else:
            tok = rng.choice([t for t in allowed if t not in eos_ids])
        state.accept(tok)
        out.append(tok)
    return out


def test_vocabulary_bytes_are_exact(tokenizer, id_bytes, vocab_size):
    text = 'Hello, world! café naïve 日本語テキスト 😀🎉 tabs\tand\nnewlines {"k": [1, 2.5e-3]}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(id_bytes[i] for i in ids) == text.encode()
    specials = special_token_ids(tokenizer)
    assert tokenizer.eos_token_id in specials and not specials & set(id_bytes)
    assert len(id_bytes) == len(tokenizer) - len(specials)
    # single tokens that decode to whole chars
    for i in random.Random(0).sample(sorted(id_bytes), 2000):
        s = tokenizer.decode([i])
        if "\ufffd" not in s:
            assert id_bytes[i] == s.encode(), i


def test_masks_width_eos_and_unconstrained_rows(backend, tokenizer, vocab_size):
    eos = tokenizer.eos_token_id
    a, b = compiled(backend, "regex", "ab?"), compiled(backend, "regex", "[0-9]+")
    assert fill_masks([None, None], vocab_size, "cpu") is None
    masks = fill_masks([a, None, b], vocab_size, "cpu")
    assert masks.shape == (3, vocab_size) and masks.dtype == torch.bool
    assert (
        masks[1].all()
        and not masks[0, len(tokenizer) :].any()
        and not masks[0, eos]
        and not masks[2, eos]
    )
    row = torch.zeros(vocab_size, dtype=torch.bool)
    a.fill_mask(row)
    assert torch.equal(row, masks[0])
    assert set(row.nonzero().flatten().tolist()) == set(
        a.compiled.index.get_allowed_tokens(a.guide.get_state())
    )
    a.accept(tokenizer.convert_tokens_to_ids("a"))
    a.fill_mask(row)
    assert row[eos] and a.is_final() and not a.is_terminated()  # "a" matches, "ab" may follow
    with pytest.raises(GrammarError):
        a.accept(tokenizer.convert_tokens_to_ids("c"))
    with pytest.raises(GrammarError):
        b.accept(eos)  # nothing matched yet
    a.accept(eos)
    assert a.is_terminated()
    with pytest.raises(GrammarError):
        a.accept(tokenizer.convert_tokens_to_ids("b"))


REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no|maybe)",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"-?[0-9]{1,4}(\.[0-9]{1,2})?",
    r"(café|日本語|😀)+!?",
    r"\{\"n\": [0-9]\}",
    r"[A-Z][a-z ]{0,12}\.",
]


@pytest.mark.parametrize("regex", REGEXES)
def test_regex_walks_fullmatch(backend, tokenizer, vocab_size, id_bytes, regex):
    eos_ids = {tokenizer.eos_token_id}
    rng = random.Random(regex)
    for _ in range(5):
        ids = walk(compiled(backend, "regex", regex), rng, vocab_size, eos_ids)
        text = b"".join(id_bytes[i] for i in ids).decode("utf-8")
        assert re.fullmatch(regex, text), (regex, text)
        assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "name", ["nested", "formats", "unicode_keys", "oneof_discriminated", "number_bounds"]
)
def test_schema_walks_token_level(backend, tokenizer, vocab_size, name):
    schema = SUITE[name][0]
    check = validator(schema)
    rng = random.Random(name)
    for _ in range(4):
        ids = walk(
            compiled(backend, "json_schema", json.dumps(schema)),
            rng,
            vocab_size,
            {tokenizer.eos_token_id},
        )
        value = json.loads(tokenizer.decode(ids))
        assert check.is_valid(value), (name, tokenizer.decode(ids))


def test_choices_multibyte(backend, tokenizer, vocab_size):
    choices = ["café au lait", "日本語", "😀 emoji", "plain"]
    rng = random.Random(1)
    seen = set()
    for _ in range(12):
        ids = walk(compiled(backend, "choices", choices), rng, vocab_size, {tokenizer.eos_token_id})
        seen.add(tokenizer.decode(ids))
    assert seen <= set(choices) and len(seen) >= 2


def test_bad_specs_fail_fast(backend):
    for kind, spec, word in [
        ("regex", "(?=a)b", "lookahead"),
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", {"type": "array", "uniqueItems": True}, "uniqueItems"),
        ("choices", [], "choices"),
        ("grammar", "x", "kind"),
    ]:
        with pytest.raises(GrammarError, match=word):
            backend.validate(kind, spec)
        fut = backend.request(kind, spec)  # request never raises: the future carries the error
        deadline = time.monotonic() + 30
        while not fut.done():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(GrammarError):
            fut.result()
    assert backend.pool.num_killed == 0, (
        "a bad constraint ran into the compile timeout instead of being refused"
    )
    with pytest.raises(GrammarError, match="regex"):  # Rust syntax error, found by the compiler
        compiled(backend, "regex", "a{")


class TinyTokenizer:
    """Four letters and a special token: enough to compile an exponential DFA slowly."""

    all_special_ids = [0]
    added_tokens_decoder: dict = {}

    def get_vocab(self):
        return {"<eos>": 0, "a": 1, "b": 2, "ab": 3, "ba": 4}


def test_compile_timeout_fails_request_without_hanging():
    backend = GrammarBackend(TinyTokenizer(), 5, [0], compile_timeout=1.0)
    slow = "(a|b)*a(a|b){22}"  # 2^23 DFA states: far longer than the timeout
    fut = backend.request("regex", slow)
    assert not fut.done()  # request returned while the compile runs: it never blocks
    while not fut.done():
        time.sleep(0.005)
    with pytest.raises(GrammarError, match="longer than"):
        fut.result()
    deadline = time.monotonic() + 10
    while backend.pool.num_killed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.pool.num_killed == 1, "the timed-out compile was not stopped"
    # the backend keeps serving others meanwhile (a replacement worker starts for it: on a loaded
    # machine that start alone can pass 1 s, so the later request gets room)
    backend.compile_timeout = 30.0
    fast = backend.request("regex", "ab")
    while not fast.done():
        time.sleep(0.005)
    assert fast.result().compiled.index is not None
    backend.shutdown()


def test_cache_shares_compiled_grammars(backend):
    spec = {
        "type": "object",
        "properties": {"cache_probe": {"type": "boolean"}},
        "required": ["cache_probe"],
    }
    f1, f2 = backend.request("json_schema", spec), backend.request("json_schema", json.dumps(spec))
    s1 = compiled(backend, "json_schema", spec)
    assert f1._future is f2._future  # one compilation for both
    f3 = backend.request("json_schema", spec)
    assert f3.done() and f3.result().compiled is s1.compiled
    assert f3.result() is not s1  # but each request has its own state


def fake_logits(history: list[int], vocab_size: int) -> torch.Tensor:
    """A deterministic stand-in for a model: scores depend on the whole history."""
    gen = torch.Generator().manual_seed(hash(tuple(history)) & 0x7FFFFFFF)
    return torch.randn(vocab_size, generator=gen)


def masked_argmax(history, source, vocab_size) -> int:
    logits = fake_logits(history, vocab_size)
    return int(
        logits.masked_fill(~fill_masks([source], vocab_size, "cpu")[0], float("-inf")).argmax()
    )


def greedy(backend, spec, vocab_size, eos, jump: bool, prefix: list[int], max_new_tokens=60):
    """Greedy decoding of a fake model; with `jump`, the scheduler's rule: pick a token after the
    last one and after every draft token (each under its own state's mask), keep the draft up to
    the first pick that differs, and that pick. Returns (output, number of forwards)."""
    state = compiled(backend, "json_schema", spec)
    out, num_forwards = [], 0
    while len(out) < max_new_tokens and not state.is_terminated():
        draft, states = state.draft(max_new_tokens - len(out) - 1) if jump else ([], [])
        num_forwards += 1
        picks = [
            masked_argmax(
                prefix + out + draft[:j],
                state if j == 0 else state.at(states[j - 1], 1 << 20),
                vocab_size,
            )
            for j in range(len(draft) + 1)
        ]
        for j, tok in enumerate(picks):
            state.accept(tok)
            out.append(tok)
            if tok == eos or state.is_terminated() or j == len(draft) or tok != draft[j]:
                break
    return out, num_forwards


# long forced key names and enum values: what jump-forward saves forwards on
JUMP_SCHEMA = {
    "type": "object",
    "properties": {
        "classification_label_explanation": {
            "enum": ["positive_sentiment_detected", "negative_sentiment_detected"]
        },
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["classification_label_explanation", "confidence"],
}


def test_jump_forward_equals_plain_greedy(backend, tokenizer, vocab_size):
    spec = JUMP_SCHEMA
    eos = tokenizer.eos_token_id
    saved = 0
    for prefix in ([], [5], [7, 9], [11]):  # different "prompts"
        on, forwards_on = greedy(backend, spec, vocab_size, eos, jump=True, prefix=prefix)
        off, forwards_off = greedy(backend, spec, vocab_size, eos, jump=False, prefix=prefix)
        assert on == off
        saved += forwards_off - forwards_on
        json.loads(tokenizer.decode([t for t in on if t != eos]))
    assert saved > 0  # jump-forward did save forwards, so the equality is meaningful


def byte_forced(fsm, text: bytes) -> bytes:
    """The truth for forced text: walk a single-byte automaton of the same regex; a byte is forced
    while the state has exactly one way on and is not accepting (ByteFSM ends matches with \x01)."""
    trans = fsm.trans
    state = fsm.index.get_initial_state()
    for b in text:
        state = trans[state][b]
    out = bytearray()
    while len(out) < MAX_DRAFT_BYTES:
        ways = trans.get(state, {})
        if len(ways) != 1 or 1 in ways:
            break
        ((b, state),) = ways.items()
        out.append(b)
    return bytes(out)


@pytest.mark.parametrize(
    "name",
    [
        "closed_object",
        "defs_ref",
        "enum_mixed",
        "const",
        "unicode_keys",
        "oneof_discriminated",
        "formats",
        "escaped_key",
    ],
)
def test_drafts_spell_the_forced_text(backend, tokenizer, vocab_size, id_bytes, name):
    """Along random walks: every draft spells a prefix of the forced text found by a single-byte
    automaton of the same regex, each draft token is allowed where it stands, the states it reports
    are the ones a guide reaches, and the masks written for those states equal the guide's own."""
    schema = SUITE[name][0]
    fsm = ByteFSM(schema_to_regex(schema))
    rng = random.Random(name)
    eos = tokenizer.eos_token_id
    num_drafted = 0
    for _ in range(3):
        state, history, text = compiled(backend, "json_schema", schema), [], b""
        while not state.is_terminated() and len(history) < 60:
            truth = byte_forced(fsm, text)
            draft, states = state.draft(100)
            spelled = b"".join(id_bytes[t] for t in draft)
            assert truth.startswith(spelled), (name, text, truth, spelled)
            shadow = compiled(backend, "json_schema", schema)
            for t in history:
                shadow.accept(t)
            for t, st in zip(draft, states):
                assert fill_masks([shadow], vocab_size, "cpu")[0][t], (
                    "a draft token is not allowed where it stands"
                )
                shadow.accept(t)
                assert shadow.guide.get_state() == st
                assert torch.equal(
                    fill_masks([shadow], vocab_size, "cpu")[0],
                    fill_masks([state.at(st, 1 << 20)], vocab_size, "cpu")[0],
                )
            num_drafted += len(draft)
            allowed = fill_masks([state], vocab_size, "cpu")[0].nonzero().flatten().tolist()
            if eos in allowed and rng.random() < 0.3:
                break
            tok = rng.choice([t for t in allowed if t != eos])
            state.accept(tok)
            history.append(tok)
            text += id_bytes[tok]
    assert num_drafted > 0, "no draft along any walk: the comparison says nothing"


def test_draft_respects_max_tokens_and_off_switch(tokenizer, vocab_size):
    on = GrammarBackend(tokenizer, vocab_size, [tokenizer.eos_token_id])
    off = GrammarBackend(tokenizer, vocab_size, [tokenizer.eos_token_id], enable_jump_forward=False)
    spec = ["supercalifragilistic", "xylophone"]
    a, b = compiled(on, "choices", spec), compiled(off, "choices", spec)
    assert a.draft(100) == ([], [])  # "s" or "x": nothing is forced yet
    first = tokenizer.encode(spec[0], add_special_tokens=False)[0]
    a.accept(first)
    b.accept(first)
    long_draft, _ = a.draft(100)
    assert long_draft and a.draft(1)[0] == long_draft[:1] and a.draft(0) == ([], [])
    assert b.draft(100) == ([], [])


@pytest.mark.parametrize(
    "kind,spec", [("json_schema", SUITE["flat_required"][0]), ("regex", r"(ab|cd)[a-z ]{0,8}\.")]
)
def test_index_built_masks_equal_guide_masks_at_every_state(backend, tokenizer, kind, spec):
    """StateMask (draft positions) builds masks from the index alone, for light states from their ids
    and for heavy ones (inside strings) as cached rows: bit for bit what a Guide standing there writes."""
    state = compiled(backend, kind, spec)
    index = state.compiled.index
    trans = index.get_transitions()
    paths = {index.get_initial_state(): []}
    frontier = list(paths)
    while frontier:  # one token path to every reachable state
        nxt = []
        for s in frontier:
            for tok, d in trans.get(s, {}).items():
                if d not in paths and tok not in backend.eos_token_ids:
                    paths[d] = paths[s] + [tok]
                    nxt.append(d)
        frontier = nxt
    num_heavy = 0
    for s, path in paths.items():
        guide = Guide(index)
        for tok in path:
            guide.advance(tok, return_tokens=False)
        want = torch.zeros(state.num_words, dtype=torch.int32)
        guide.write_mask_into(want.data_ptr(), want.numel(), 4)
        got = torch.full((state.num_words,), -1, dtype=torch.int32)
        state.at(s, 1 << 20).write_bits(got)
        assert torch.equal(got, want), (kind, s)
        num_heavy += state.compiled.facts(s)[1] >= HEAVY_STATE_TOKENS
    assert num_heavy > 0 or kind == "regex"


def test_llguidance_time_limit_counts_from_the_start_of_the_build(tokenizer):
    """A build queued behind a slow one on llguidance's builder thread is built, not failed for
    the wait; a build that starts and outruns its limit is reported as not judged."""
    pytest.importorskip("llguidance")
    from radixrt.runtime.constrained.llg_backend import LLGuidanceBackend

    llg = LLGuidanceBackend(
        tokenizer, len(tokenizer), [tokenizer.eos_token_id], compile_timeout=1.0
    )
    try:
        llg._pool.submit(time.sleep, 1.5)  # noqa: SLF001 (occupies the builder past the limit)
        queued = llg.request("regex", "(yes|no)")
        while not queued.done():
            time.sleep(0.01)
        assert queued.result().matcher.is_accepting() is False
        build = llg._build  # noqa: SLF001

        def slow_build(kind, spec, started):
            started.append(time.monotonic())
            time.sleep(3.0)
            return build(kind, spec, [])

        llg._build = slow_build  # noqa: SLF001 (a build that outruns its 1 s limit)
        late = llg.request("regex", "(yes|no)")
        while not late.done():
            time.sleep(0.01)
        with pytest.raises(GrammarError, match="longer than"):
            late.result()
    finally:
        llg.shutdown()
