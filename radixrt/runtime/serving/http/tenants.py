"""Many tenants at the HTTP edge: who a request's client is, the per-client caps, and what a client
is told about the cache.

A client is its cache_salt when it sends one, else the API key it presented (when the server checks
keys), else its remote address. The salt first: it is the tenant an operator's gateway names (every
request through a gateway comes from one address with one key), and it is the trust domain the KV
is already split by (core/namespaces.py). The key before the address: the gate has checked it, and
addresses are shared behind NAT and proxies. A client that reaches the server directly may choose
its own salts, and so split itself into many clients: the caps bound a tenant behind a gateway
that sets the salt, or a client by its address, not one that mints salts (docs/security.md).

Caps, each refusal a 429 naming its limit: requests in flight (running + queued) per client
(--max-requests-per-client, default half of what may be in flight), and grammar compiles queued at
the edge per client (MAX_COMPILES_PER_CLIENT, half of the compile pool's queue), so one client
never fills every in-flight slot or the whole compile queue.

cached_tokens: a count exact to the token tells a client how much of its prompt some earlier
request (anybody's, without a salt) shared, token by token: with page size 1, guess the next token
of another tenant's prompt and watch the count grow. Unless the operator asks for exact counts
(--enable-cache-report), the count is rounded down to CACHED_TOKENS_GRANULE tokens (a whole number
of pages, at least 64 tokens): a hit is seen only once a whole 64-token block matches, so a prompt
is no longer read a token per request. Rounding is defence in depth, not isolation: a block with
one unknown token in otherwise known text is still guessable, and time to first token tells hits
apart without any count; only distinct salts share nothing (the guarantee, docs/security.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

from radixrt.runtime.serving.http.protocol import APIError

CACHED_TOKENS_GRANULE = 64
# half of the edge compile pool's queue (constrained/compile_pool.py CompilePool max_pending=64)
MAX_COMPILES_PER_CLIENT = 32


def client_of(request: Any, config: Any, cache_salt: str | None) -> str:
    """The client a request counts against (never the salt or key itself: a digest)."""
    if cache_salt is not None:
        return "salt:" + _digest(cache_salt)
    auth = request.headers.get("authorization") if request is not None else None
    if config.api_key is not None and auth:
        return "key:" + _digest(auth)
    host = getattr(getattr(request, "client", None), "host", None)
    return f"addr:{host or 'unknown'}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def reported_cached_tokens(cached: int, page_size: int, exact: bool) -> int:
    """What a client is told of its cached prompt tokens: exact with --enable-cache-report, else
    rounded down to whole pages of at least CACHED_TOKENS_GRANULE tokens."""
    if exact:
        return cached
    pages = max(1, -(-CACHED_TOKENS_GRANULE // page_size))
    granule = pages * page_size
    return cached - cached % granule


def check_in_flight(held: int, asked: int, limit: int) -> None:
    """A client holding `held` rows in flight asks for `asked` more (limit: the config's
    requests_per_client; rows_held counts them): a 429 past the limit, a 400 when one body alone
    asks for more."""
    if asked > limit:
        raise APIError(
            f"the request asks for {asked} sequences; one client may have at most {limit} in "
            "flight (max_requests_per_client)",
            param="prompt",
        )
    if held + asked > limit:
        raise APIError(
            f"this client has {held} sequences in flight (each beam of a beam search counts); at "
            f"most {limit} are allowed per client (max_requests_per_client): try again later",
            429,
            "rate_limit_error",
            code="too_many_requests",
        )


class CompileShares:
    """Grammar compiles each client has queued at the edge; one past MAX_COMPILES_PER_CLIENT is a
    429 (the others' compiles find room in the pool's queue)."""

    def __init__(self, limit: int = MAX_COMPILES_PER_CLIENT):
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, client: str | None) -> None:
        if client is None:
            return
        held = self._held.get(client, 0)
        if held >= self.limit:
            raise APIError(
                f"this client has {held} grammar compiles queued; at most {self.limit} are allowed "
                "per client: try again later",
                429,
                "rate_limit_error",
                code="too_many_requests",
            )
        self._held[client] = held + 1

    def give_back(self, client: str | None) -> None:
        if client is None:
            return
        left = self._held[client] - 1
        if left:
            self._held[client] = left
        else:
            del self._held[client]  # no entry per client ever seen: the table stays small

    def held(self, client: str) -> int:
        return self._held.get(client, 0)
