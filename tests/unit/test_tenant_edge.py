"""Tenants at the HTTP edge (serving/http/tenants.py): who a client is, the cached_tokens a client is
told, and the per-client share of the edge's grammar compiles, checked on the tokenizer manager's
own validation path with a compile that blocks until released (the truth: which calls are refused
while the others are still compiling). The in-flight cap on a real server: test_tenant_battery.py."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from radixrt.runtime.constrained.compile_pool import CompilePool
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.http.tenants import (
    CACHED_TOKENS_GRANULE,
    MAX_COMPILES_PER_CLIENT,
    CompileShares,
    check_in_flight,
    client_of,
    reported_cached_tokens,
)
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager


def request(host="10.0.0.1", auth=None):
    headers = {} if auth is None else {"authorization": auth}
    return SimpleNamespace(headers=headers, client=SimpleNamespace(host=host))


def test_a_client_is_its_salt_else_its_checked_key_else_its_address():
    keyed, open_ = SimpleNamespace(api_key="k"), SimpleNamespace(api_key=None)
    a = client_of(request("10.0.0.1", "Bearer k"), keyed, "tenant-a")
    assert a == client_of(request("10.0.0.2"), open_, "tenant-a")  # the salt, wherever from
    assert a != client_of(request("10.0.0.1", "Bearer k"), keyed, "tenant-b")
    assert "tenant-a" not in a  # a digest: the salt itself is kept nowhere
    by_key = client_of(request("10.0.0.1", "Bearer k"), keyed, None)
    assert (
        by_key == client_of(request("10.0.0.9", "Bearer k"), keyed, None) and "k" not in by_key[4:]
    )
    # without a key to check, a header a client makes up is no identity: its address is
    assert client_of(request("10.0.0.1", "Bearer made-up"), open_, None) == "addr:10.0.0.1"
    assert client_of(request("10.0.0.2"), open_, None) == "addr:10.0.0.2"


@pytest.mark.parametrize(
    "page_size, granule", [(1, 64), (4, 64), (16, 64), (48, 96), (64, 64), (128, 128)]
)
def test_cached_tokens_are_whole_pages_of_at_least_64_tokens_unless_exact(page_size, granule):
    assert CACHED_TOKENS_GRANULE == 64
    for cached in (0, 1, granule - 1, granule, granule + page_size, 5 * granule + 3):
        told = reported_cached_tokens(cached, page_size, exact=False)
        assert told % granule == 0 and told % page_size == 0 and cached - granule < told <= cached
        assert reported_cached_tokens(cached, page_size, exact=True) == cached


def test_the_in_flight_cap_is_a_429_and_a_body_over_it_a_400():
    check_in_flight(held=9, asked=1, limit=10)
    with pytest.raises(APIError) as e:
        check_in_flight(held=10, asked=1, limit=10)
    assert e.value.status == 429 and "max_requests_per_client" in e.value.message
    with pytest.raises(APIError) as e:
        check_in_flight(held=0, asked=11, limit=10)
    assert e.value.status == 400 and e.value.param == "prompt"


def test_a_client_may_queue_half_of_the_compile_pool():
    assert MAX_COMPILES_PER_CLIENT * 2 == CompilePool().max_pending
    shares = CompileShares(limit=2)
    shares.take("a"), shares.take("a"), shares.take("b")
    with pytest.raises(APIError) as e:
        shares.take("a")
    assert e.value.status == 429 and "grammar compiles" in e.value.message
    shares.give_back("a")
    shares.take("a")
    for c in ("a", "a", "b"):
        shares.give_back(c)
    assert shares.held("a") == shares.held("b") == 0


class BlockingGrammar:
    """The edge's grammar chooser: validate() blocks until released (a slow compile)."""

    def __init__(self):
        self.release = threading.Event()
        self.started = 0

    def for_kind(self, kind):
        return self

    def validate(self, kind, spec):
        self.started += 1
        assert self.release.wait(10), "never released"


def test_the_tokenizer_managers_compiles_are_shared_per_client():
    tm = TokenizerManager.__new__(TokenizerManager)  # no sockets, no tokenizer: the edge alone
    tm._grammar, tm._compiles = BlockingGrammar(), CompileShares(limit=2)
    params = {"regex": "[ab]+", "max_new_tokens": 4}

    async def scenario():
        greedy = [asyncio.create_task(tm.validate_sampling(params, "greedy")) for _ in range(2)]
        while tm._grammar.started < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(APIError) as e:
            await tm.validate_sampling(params, "greedy")
        assert e.value.status == 429
        other = asyncio.create_task(tm.validate_sampling(params, "other"))
        while tm._grammar.started < 3:  # the other client's compile started beside them
            await asyncio.sleep(0.01)
        tm._grammar.release.set()
        await asyncio.gather(*greedy, other)
        assert tm._compiles.held("greedy") == 0
        await tm.validate_sampling(params, "greedy")  # its share is back

    asyncio.run(scenario())
