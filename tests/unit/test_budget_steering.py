"""Budget steering (constrained/budget.py): the distance table and the steered picks.

Truths: on a tiny vocabulary, the fewest tokens that complete a match, found by brute force over token
sequences judged by `re.fullmatch` (no automaton involved); on the real tokenizer, the distances of the
transition map (get_transitions, reverse BFS in test_grammar.py) and `jsonschema` for the output. The
steered decoding loop is the scheduler's rule (a pick with b tokens left masks with for_budget(b)) over a
deterministic fake model: with b at least the shortest completion the output is complete and valid; with
less it is unchanged and incomplete; where unsteered decoding finished inside b the output is identical.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import time

import pytest
from outlines_core import Index, Vocabulary
from test_grammar import compiled, distances, masked_argmax, validator

from radixrt.runtime.constrained.backend import GrammarBackend
from radixrt.runtime.constrained.budget import UNREACHABLE, completion_distances

TINY = ["a", "b", "ab", "ba", "1", "12", "{", "}", '"', '"}', ","]
TINY_EOS = len(TINY)
TINY_REGEXES = [
    "a+b",
    "(ab|ba)*c?a",
    r'\{("a"|"b1*")(,"a")*\}',
    "[ab]{3,5}",
    r"1(2|a)*b\}?",
    "(a|b)*1{4}",
]


def brute_force_distance(regex: str, text: str, limit: int = 4) -> int:
    """Fewest tokens appended to `text` that make a full match (UNREACHABLE past `limit`)."""
    for k in range(limit + 1):
        for seq in itertools.product(TINY, repeat=k):
            if re.fullmatch(regex, text + "".join(seq)):
                return k
    return UNREACHABLE


@pytest.mark.parametrize("regex", TINY_REGEXES)
def test_distances_equal_brute_force_on_a_tiny_vocabulary(regex):
    vocab = Vocabulary(TINY_EOS, {t: [i] for i, t in enumerate(TINY)})
    index = Index(regex, vocab)
    dist, max_next = completion_distances(index)
    rng = random.Random(0)
    seen = 0
    for _ in range(40):  # random walks: every state on them is checked against re
        state, text = index.get_initial_state(), ""
        for _ in range(rng.randrange(6)):
            moves = [t for t in index.get_allowed_tokens(state) if t != TINY_EOS]
            if not moves:
                break
            t = rng.choice(moves)
            state, text = index.get_next_state(state, t), text + TINY[t]
        want = brute_force_distance(regex, text)
        if want <= 4:  # deeper answers are past the brute force's reach
            assert dist[state] == want, (regex, text)
            seen += 1
        succ = [
            index.get_next_state(state, t) for t in index.get_allowed_tokens(state) if t != TINY_EOS
        ]
        assert max_next[state] == max((dist.get(s, UNREACHABLE) for s in succ), default=0)
    assert seen >= 20


UNBOUNDED = {
    "id_int_or_short_string": {
        "type": "object",
        "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]}},
        "required": ["id"],
    },
    "free_string": {
        "type": "object",
        "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["note", "n"],
    },
    "int_array": {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
        "required": ["xs"],
    },
    "recursive_tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "open_object": {
        "type": "object",
        "properties": {"k": {"type": "number"}},
        "required": ["k"],
        "additionalProperties": {"type": "string"},
    },
}


@pytest.fixture(scope="module")
def backend(tokenizer):
    be = GrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id], compile_timeout=120.0)
    yield be
    be.shutdown()


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_distances_equal_the_transition_maps_bfs(backend, name):
    grammar = compiled(backend, "json_schema", json.dumps(UNBOUNDED[name])).compiled
    _, want = distances(grammar)
    assert grammar.steering.dist == want


def decode(state, prefix, vocab_size, eos, max_new_tokens, steer=True):
    """The scheduler's loop over a fake model; each pick is masked by for_budget(tokens left)."""
    out = []
    while len(out) < max_new_tokens and not state.is_terminated():
        source = state.for_budget(max_new_tokens - len(out)) if steer else state
        tok = masked_argmax(prefix + out, source, vocab_size)
        state.accept(tok)
        out.append(tok)
        if tok == eos:
            break
    return out


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_steered_output_is_valid_whenever_a_completion_fits(backend, tokenizer, name):
    spec = json.dumps(UNBOUNDED[name])
    vocab_size, eos = len(tokenizer), tokenizer.eos_token_id
    first = compiled(backend, "json_schema", spec)
    shortest = first.compiled.steering.dist[first.guide.get_state()]
    prefix = tokenizer.encode(f"{name}:")
    free = decode(compiled(backend, "json_schema", spec), prefix, vocab_size, eos, 400, steer=False)
    for budget in sorted(
        {0, 1, shortest - 1, shortest, shortest + 1, shortest + 3, shortest + 8, 25, 60, 400}
    ):
        if budget < 0:
            continue
        state = compiled(backend, "json_schema", spec)
        out = decode(state, prefix, vocab_size, eos, budget)
        if budget >= shortest:
            assert state.is_final(), (
                f"{name}: budget {budget} >= shortest {shortest} but output incomplete"
            )
            text = tokenizer.decode([t for t in out if t != eos])
            errors = [e.message for e in validator(UNBOUNDED[name]).iter_errors(json.loads(text))]
            assert not errors, (name, budget, text, errors)
        else:
            assert not state.is_final()
            assert out == free[:budget], "nothing fits: steering must leave the output alone"
        if len(free) <= budget and free[-1:] == [eos]:
            assert out == free, (
                f"{name}: unsteered decoding finished inside {budget} tokens; steering changed it"
            )


def test_steering_engages_only_near_the_end(backend, tokenizer):
    state = compiled(backend, "json_schema", json.dumps(UNBOUNDED["free_string"]))
    steering, s = state.compiled.steering, state.guide.get_state()
    assert state.for_budget(10_000) is state
    assert not steering.engages(s, steering.dist[s] - 1), "no steering when no completion fits"
    # with exactly the shortest completion's budget, some token (the free string's, or a space) would overrun it
    assert steering.engages(s, steering.dist[s])


@pytest.fixture(scope="module")
def auto(tokenizer, backend):
    """--grammar-backend auto: llguidance serves, an outlines shadow steers (fallback.py)."""
    pytest.importorskip("llguidance")
    from radixrt.runtime.constrained.fallback import FallbackBackend
    from radixrt.runtime.constrained.llg_backend import LLGuidanceBackend

    llg = LLGuidanceBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield FallbackBackend(llg, backend, shadow=True)
    llg.shutdown()


def shadowed(auto, spec):
    """An llguidance state whose outlines shadow has arrived (steering is then deterministic)."""
    state = compiled(auto, "json_schema", spec)
    assert type(state).__name__ == "LLGState"
    for _ in range(2000):
        if state.shadow._future.done():
            break
        time.sleep(0.01)
    return state


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_llguidance_requests_are_steered_by_their_outlines_shadow(auto, backend, tokenizer, name):
    spec = json.dumps(UNBOUNDED[name])
    vocab_size, eos = len(tokenizer), tokenizer.eos_token_id
    first = compiled(backend, "json_schema", spec)
    shortest = first.compiled.steering.dist[first.guide.get_state()]
    prefix = tokenizer.encode(f"{name}:")
    free = decode(shadowed(auto, spec), prefix, vocab_size, eos, 400, steer=False)
    survived = 0
    for budget in sorted({shortest, shortest + 1, shortest + 3, shortest + 8, 25, 60}):
        state = shadowed(auto, spec)
        out = decode(state, prefix, vocab_size, eos, budget)
        if state.shadow.current() is None:
            continue  # the fake model left outlines' stricter language before steering engaged
        survived += 1
        assert state.is_final(), (
            f"{name}: budget {budget} >= shortest {shortest} but output incomplete"
        )
        text = tokenizer.decode([t for t in out if t != eos])
        errors = [e.message for e in validator(UNBOUNDED[name]).iter_errors(json.loads(text))]
        assert not errors, (name, budget, text, errors)
        if len(free) <= budget and free[-1:] == [eos]:
            assert out == free, (
                f"{name}: unsteered decoding finished inside {budget} tokens; steering changed it"
            )
    assert survived >= 1, f"{name}: the shadow was lost in every run"
