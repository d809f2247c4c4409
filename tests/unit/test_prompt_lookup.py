"""PromptLookup against a naive search: the draft follows the latest earlier occurrence of the last
3 tokens, else of the last 2; misses back off."""

import random

import pytest

from radixrt.runtime.core.prompt_lookup import MAX_BACKOFF_STEPS, PromptLookup


def naive_draft(tokens: list[int], k: int) -> list[int]:
    n_tok = len(tokens)
    for n in (3, 2):
        if n_tok <= n:
            continue
        tail = tokens[n_tok - n :]
        # latest occurrence that ends before the tail's last token
        for i in range(n_tok - n - 1, -1, -1):
            if tokens[i : i + n] == tail:
                return tokens[i + n : i + n + k]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_matches_naive_search_as_tokens_append(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 20])  # small vocabularies repeat n-grams often
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
    lookup = PromptLookup(num_draft=rng.randint(1, 6))
    hits = 0
    for _ in range(60):
        limit = rng.randint(0, 8)
        got = lookup.propose(tokens, limit)
        assert got == naive_draft(tokens, min(limit, lookup.num_draft)), tokens
        hits += bool(got)
        tokens.append(rng.randrange(vocab) if rng.random() < 0.5 or not got else got[0])
    assert hits > 0  # the case the test names was exercised


def test_misses_back_off_and_a_hit_resets():
    tokens = [1, 2, 3, 9, 1, 2, 3]
    lookup = PromptLookup(num_draft=2)
    assert lookup.propose(tokens, 10) == [9, 1]
    lookup.record(2, 0)  # missed at the first token: wait one step
    assert lookup.propose(tokens, 10) == []
    assert lookup.propose(tokens, 10) == [9, 1]
    lookup.record(2, 0)  # missed again: wait two
    assert [lookup.propose(tokens, 10) for _ in range(3)] == [[], [], [9, 1]]
    lookup.record(2, 1)  # a hit resets the wait
    lookup.record(2, 0)
    assert [lookup.propose(tokens, 10) for _ in range(2)] == [[], [9, 1]]
    for _ in range(10):
        lookup.record(2, 0)
    assert lookup._backoff == MAX_BACKOFF_STEPS
