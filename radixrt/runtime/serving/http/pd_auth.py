"""Bootstrap fields come from the router side only: on a prefill or decode server a request that
carries any of them must be authenticated with the pair's secret (--disaggregation-secret, which
sglang-router presents as its --api-key). A plain client's bootstrap fields are a 403, so no client
can name a room, and so another request's KV, on its own."""

from __future__ import annotations

import hmac
from typing import Any

from radixrt.runtime.serving.http.protocol import APIError


def check_bootstrap_auth(config: Any, headers: Any, fields: tuple[Any, Any, Any]) -> None:
    """fields: the body's (bootstrap_host, bootstrap_port, bootstrap_room); headers: the HTTP
    request's. In null mode they are ignored (as SGLang's servers do), so nothing is checked."""
    if config.disaggregation_mode == "null" or all(f is None for f in fields):
        return
    # the header's own bytes (Starlette decoded them as latin-1, which gives them back exactly)
    # against the secret's UTF-8, as the API keys are compared (auth_levels.KeyCheck): encoding
    # the secret with "replace" made a non-Latin-1 secret "Bearer ????", which anyone could send
    try:
        given = (headers.get("authorization") or "").encode("latin-1")
    except UnicodeEncodeError:  # not an HTTP header's text: nothing to match
        given = b""
    expected = f"Bearer {config.disaggregation_secret}".encode("utf-8")
    if not given or not hmac.compare_digest(given, expected):
        raise APIError(
            "bootstrap fields are taken only from the router (Authorization: Bearer with the "
            "pair's --disaggregation-secret)",
            403,
            "permission_error",
            param="bootstrap_room",
            code="bootstrap_not_authorized",
        )
