"""POST /pin_prefix and /unpin: a program keeps a fork's shared prefix pinned over HTTP; POST
/close_session ends a session (core/sessions.py) and lets its pinned turn go.

/pin_prefix computes the prompt's KV (max_new_tokens=0) and leaves its radix path locked
under a handle until /unpin or the ttl; the scheduler may refuse (handle null), and the DSL
then falls back to plain prefix caching.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.core.pins import MAX_PIN_TTL_S
from radixrt.runtime.messages import CloseSessionReq, UnpinReq
from radixrt.runtime.request.option_checks import MAX_CACHE_SALT_CHARS, MAX_SESSION_ID_CHARS
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.http_io import collect_results, read_body
from radixrt.runtime.serving.http.protocol import APIError, parse_body
from radixrt.runtime.serving.http.tenants import client_of


class PinPrefixRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | None = None
    input_ids: list[int] | None = None
    program_id: str | None = None
    ttl_s: float = Field(default=600.0, gt=0, le=MAX_PIN_TTL_S)
    # pinned in that salt's namespace: its requests hit it, nobody else's (core/namespaces.py)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)


MAX_PIN_HANDLE_CHARS = 64  # a handle is secrets.token_urlsafe(16): 22 characters


class CloseSessionRequest(BaseModel):
    # bounded as where they are made (option_checks.py): nothing longer names one
    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)
    # the session's salt: a session belongs to its tenant
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)


class UnpinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    handle: str = Field(min_length=1, max_length=MAX_PIN_HANDLE_CHARS)


def add_pin_routes(app: FastAPI, tm: Any) -> None:
    config = tm.config
    scheduler = tm.scheduler

    @app.post("/pin_prefix")
    async def pin_prefix(request: Request) -> dict[str, Any]:
        req: PinPrefixRequest = parse_body(
            PinPrefixRequest, await read_body(request, config.max_request_body_bytes)
        )
        if (req.text is None) == (req.input_ids is None):
            raise APIError("give exactly one of text and input_ids", param="text")
        ids = (
            (await tm.encode([req.text], add_special_tokens=True))[0]
            if req.text is not None
            else req.input_ids
        )
        # no bootstrap fields in this body: a disaggregated server refuses it (the edge)
        options = RequestOptions(
            program_id=req.program_id,
            pin_ttl_s=req.ttl_s,
            cache_salt=req.cache_salt,
            client=client_of(request, config, req.cache_salt),
        )
        reqs = (await tm.admit([ids], [{"max_new_tokens": 0}], [options]))[0]
        handle = tm.generate(reqs)
        res = SequenceResult(reqs[0].rid)
        await collect_results(request, handle, [res])
        return {
            "handle": (res.finished_reason or {}).get("pin_handle"),
            "prompt_tokens": res.prompt_tokens,
            "cached_tokens": res.cached_tokens,
        }

    @app.post("/unpin")
    async def unpin(request: Request) -> dict[str, Any]:
        req: UnpinRequest = parse_body(
            UnpinRequest, await read_body(request, config.max_request_body_bytes)
        )
        scheduler.check_alive()
        # fire and forget: an unknown handle is a no-op
        scheduler.send_admin(UnpinReq(handle=req.handle))
        return {"success": True}

    @app.post("/close_session")
    async def close_session(request: Request) -> dict[str, Any]:
        req: CloseSessionRequest = parse_body(
            CloseSessionRequest, await read_body(request, config.max_request_body_bytes)
        )
        scheduler.check_alive()
        # an unknown session is a no-op
        scheduler.send_admin(CloseSessionReq(session_id=req.session_id, cache_salt=req.cache_salt))
        return {"success": True}
