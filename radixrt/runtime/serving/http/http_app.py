"""The FastAPI app: the routes of every *_routes.py module (SGLang-native /generate, status with
/metrics, admin, OpenAI, pins, the cache view, tokenize), the error handlers, and the gate every
request passes first.

Every error is an OpenAI-style body {"error": {"message", "type", "param", "code"}}; a crash
answers a generic message with an error id, the detail goes to the log. Which key each route needs
(--api-key, --admin-api-key): auth_levels.py.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixrt.runtime.serving.http.admin_routes import add_admin_routes
from radixrt.runtime.serving.http.auth_levels import KeyCheck, mark_admin
from radixrt.runtime.serving.http.browser_guard import BrowserGuard
from radixrt.runtime.serving.http.cache_routes import add_cache_routes
from radixrt.runtime.serving.http.generate_routes import add_generate_routes
from radixrt.runtime.serving.http.http_io import ClientGone
from radixrt.runtime.serving.http.lora_routes import add_lora_routes
from radixrt.runtime.serving.http.metrics import ServerMetrics
from radixrt.runtime.serving.http.pin_routes import add_pin_routes
from radixrt.runtime.serving.http.protocol import APIError, error_body
from radixrt.runtime.serving.http.status_routes import add_status_routes
from radixrt.runtime.serving.http.tokenize_routes import add_tokenize_routes
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager
from radixrt.runtime.serving.openai_api.openai_routes import add_openai_routes

logger = logging.getLogger(__name__)


# headers whose value decides who a request is or whether it is served: each must come once
DECIDING_HEADERS = frozenset({"authorization", "host", "origin", "content-type"})


class GateMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it would hide client disconnects): the browser guard (Host,
    Origin, JSON bodies), the keys by the route's level (auth_levels.py), and per-route counts (by
    the app's own paths, so a client cannot grow the metric's labels)."""

    def __init__(
        self,
        app: Any,
        keys: KeyCheck,
        metrics: ServerMetrics,
        guard: BrowserGuard,
        routes: frozenset[str],
    ):
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.guard = guard
        self.routes = routes  # the app's paths: any other path is counted as "other"

    def refusal(self, scope: dict) -> tuple[int, dict] | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        # one value each for the headers this server decides on: the gate below reads the last of
        # repeated ones, the routes (client_of, the Responses store) read the first, so two
        # Authorization headers (one valid) would mint a free client identity
        repeated = sorted(
            name
            for name in DECIDING_HEADERS & headers.keys()
            if sum(k.lower() == name.encode() for k, _ in scope["headers"]) > 1
        )
        if repeated:
            return 400, error_body(
                f"the {repeated[0]} header is given more than once",
                param=repeated[0],
                code="duplicate_header",
            )
        if not self.guard.host_ok(headers.get("host")):
            return 400, error_body(
                f"Host header {headers.get('host')!r} is not this server's (see --allowed-hosts)",
                param="host",
                code="invalid_host",
            )
        if not self.guard.origin_ok(headers.get("origin"), headers.get("host")):
            return 403, error_body(
                f"Origin {headers.get('origin')!r} is not allowed (see --allowed-origins)",
                param="origin",
                code="origin_not_allowed",
            )
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        if not self.guard.content_type_ok(scope["method"], headers.get("content-type"), has_body):
            return 415, error_body(
                "POST bodies must be JSON: send Content-Type: application/json",
                param="content-type",
                code="unsupported_media_type",
            )
        authorization = headers.get("authorization", "").encode("latin-1")
        refused = self.keys.refusal(scope["path"], authorization)
        if refused is not None:
            return refused.status, error_body(
                refused.message, "invalid_request_error", code=refused.code
            )
        mark_admin(scope, self.keys.holds(authorization)[1])
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = [500]

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refused = self.refusal(scope)
            if refused is not None:
                return await JSONResponse(refused[1], refused[0])(scope, receive, send_status)
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.on_http(path if path in self.routes else "other", status[0])


def add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI-style body; a client that left gets a 499 nobody reads."""

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), e.status)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind, code=e.status_code), e.status_code)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(e.errors()[:3])), 400)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; the requests were aborted

    @app.exception_handler(Exception)
    async def on_crash(request: Request, e: Exception) -> JSONResponse:
        # the exception's text may hold paths, config or another request's data: the log only
        error_id = secrets.token_hex(6)
        logger.exception("internal error %s on %s", error_id, request.url.path)
        message = f"internal error (error id {error_id}; the server's log has the detail)"
        return JSONResponse(error_body(message, "server_error", code=500), 500)


def create_app(
    tm: TokenizerManager, served_model_name: str, metrics: ServerMetrics | None = None
) -> FastAPI:
    metrics = metrics or tm.scheduler.metrics
    config = tm.config
    app = FastAPI(title="radixrt", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tm = tm
    add_error_handlers(app)
    add_generate_routes(app, tm)
    add_status_routes(app, tm, served_model_name, metrics)
    add_admin_routes(app, tm)
    add_lora_routes(app, tm)
    add_openai_routes(app, tm, served_model_name)
    add_pin_routes(app, tm)
    add_cache_routes(app, tm)
    add_tokenize_routes(app, tm)
    guard = BrowserGuard(config.host, config.port, config.allowed_hosts, config.allowed_origins)
    routes = frozenset(route.path for route in app.routes)
    exposed = config.disaggregation_mode != "null"
    keys = KeyCheck(config.api_key, config.admin_api_key, exposed)
    app.add_middleware(GateMiddleware, keys=keys, metrics=metrics, guard=guard, routes=routes)
    return app
