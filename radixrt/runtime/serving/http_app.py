"""The FastAPI app: SGLang-native /generate, admin routes, /metrics, and the OpenAI routes.

Every error is an OpenAI-style body {"error": {"message", "type", "param", "code"}}.
With --api-key, every route but /health and the dashboard's static page (cache_routes.py) needs
`Authorization: Bearer <key>`.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixrt.runtime.messages import ProfileReq
from radixrt.runtime.request_edge import SequenceResult, generate_output
from radixrt.runtime.serving.browser_guard import BrowserGuard
from radixrt.runtime.serving.cache_routes import PUBLIC_PATHS, add_cache_routes
from radixrt.runtime.serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from radixrt.runtime.serving.openai_routes import SSE_HEADERS, add_openai_routes
from radixrt.runtime.serving.pin_routes import add_pin_routes
from radixrt.runtime.serving.protocol import (
    SSE_DONE,
    APIError,
    ClientGone,
    ConcatAndAppendRequest,
    GenerateRequest,
    ProfileRequest,
    accumulate,
    collect_results,
    error_body,
    parse_body,
    read_body,
    sse,
)
from radixrt.runtime.serving.request_handle import RequestHandle
from radixrt.runtime.serving.tokenize_routes import add_tokenize_routes
from radixrt.runtime.serving.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

_ROUTES = {
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/get_model_info",
    "/get_server_info",
    "/flush_cache",
    "/metrics",
    "/pin_prefix",
    "/unpin",
    "/cache_tree",
    "/tokenize",
    "/detokenize",
    "/model_info",
    "/server_info",
    "/close_session",
    *PUBLIC_PATHS,
}


class GateMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it would hide client disconnects): the browser guard (Host,
    Origin, JSON bodies), the API key, and per-route counts."""

    def __init__(self, app: Any, api_key: str | None, metrics: ServerMetrics, guard: BrowserGuard):
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.metrics = metrics
        self.guard = guard

    def refusal(self, scope: dict) -> tuple[int, dict] | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
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
        if (
            self.expected is not None
            and scope["path"] != "/health"
            and scope["path"] not in PUBLIC_PATHS
        ):
            if not hmac.compare_digest(
                headers.get("authorization", "").encode("latin-1"), self.expected
            ):
                return 401, error_body(
                    "invalid or missing API key (Authorization: Bearer <key>)",
                    "invalid_request_error",
                    code="invalid_api_key",
                )
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
            self.metrics.on_http(path if path in _ROUTES else "other", status[0])


def _per_prompt(value: Any, num: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != num:
            raise APIError(f"{name} has {len(value)} entries for {num} prompts", param=name)
        return value
    return [value] * num


def create_app(
    tm: TokenizerManager, served_model_name: str, metrics: ServerMetrics | None = None
) -> FastAPI:
    metrics = metrics or tm.metrics
    config = tm.config
    app = FastAPI(title="radixrt", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tm = tm

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
        logger.exception("internal error on %s", request.url.path)
        return JSONResponse(
            error_body(f"internal error: {type(e).__name__}: {e}", "server_error", code=500), 500
        )

    # ------------------------------------------------------------------ SGLang-native
    @app.post("/generate")
    async def generate(request: Request) -> Any:
        req: GenerateRequest = parse_body(
            GenerateRequest, await read_body(request, config.max_request_body_bytes)
        )
        if (req.text is None) == (req.input_ids is None):
            raise APIError("give exactly one of text and input_ids", param="text")
        if req.text is not None:
            batch = isinstance(req.text, list)
            prompts = await tm.encode(req.text if batch else [req.text], add_special_tokens=True)
        else:
            batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
            prompts = req.input_ids if batch else [req.input_ids]
        if not prompts:
            raise APIError("the batch is empty", param="text")
        num = len(prompts)
        params = _per_prompt(req.sampling_params, num, "sampling_params")
        return_logprob = _per_prompt(req.return_logprob, num, "return_logprob")
        starts = _per_prompt(req.logprob_start_len, num, "logprob_start_len")
        tops = _per_prompt(req.top_logprobs_num, num, "top_logprobs_num")
        reqs, flat_logprob = [], []  # n copies of prompt i follow each other (SGLang's order)
        for i, ids in enumerate(prompts):
            sp = await tm.validate_sampling(params[i])
            if req.session() is not None and len(prompts) > 1:
                raise APIError(
                    "session_id needs a single prompt (a session continues one conversation)",
                    param="session_id",
                )
            copies = tm.make_requests(
                ids,
                sp,
                stream=req.stream,
                return_logprob=return_logprob[i],
                logprob_start_len=starts[i],
                top_logprobs_num=tops[i],
                program_id=req.program_id,
                session_id=req.session(),
            )
            reqs += copies
            flat_logprob += [return_logprob[i]] * len(copies)
        many = batch or len(reqs) > 1
        handle = tm.generate(reqs)
        results = [SequenceResult(r.rid) for r in reqs]
        token_text = (
            (lambda t: tm.tokenizer.decode([t]))
            if req.return_text_in_logprobs
            else (lambda t: None)
        )

        def output(i: int, logprobs_from: int = 0) -> dict[str, Any]:
            return generate_output(
                results[i], flat_logprob[i], token_text, i if many else None, logprobs_from
            )

        if req.stream:
            intervals = [r.sampling_params.get("stream_interval") or 1 for r in reqs]
            return StreamingResponse(
                _stream_generate(handle, results, output, intervals),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )

        await collect_results(request, handle, results)
        outs = [output(i) for i in range(len(results))]
        return outs if many else outs[0]

    # ------------------------------------------------------------------ admin
    @app.get("/health")
    async def health() -> Response:
        if await tm.health_probe():
            return Response(status_code=200)
        reason = tm.dead_reason or "the scheduler did not answer the health probe"
        return JSONResponse(error_body(reason, "server_error", code=503), 503)

    @app.get("/get_model_info")
    @app.get("/model_info")  # SGLang serves both names
    async def get_model_info() -> dict[str, Any]:
        # the chat template travels too, so a client (the DSL over HTTP or sgl.OpenAI) renders roles as we do
        tok = tm.tokenizer
        return {
            **tm.model_info,
            "served_model_name": served_model_name,
            "tokenizer_path": config.model_path,
            "chat_template": getattr(tok, "chat_template", None),
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> dict[str, Any]:
        info = await tm.server_info()
        cfg = dataclasses.asdict(config)
        cfg["api_key"] = None if config.api_key is None else "***"
        return {
            **cfg,
            **info,
            "num_inflight_requests": len(tm.states),
            "served_model_name": served_model_name,
        }

    @app.post("/flush_cache")  # state-changing routes are POST only
    async def flush_cache() -> JSONResponse:
        ok = await tm.flush_cache()
        if ok:
            return JSONResponse({"success": True, "message": "cache flushed"})
        return JSONResponse(error_body("cache not flushed: requests are running", code=400), 400)

    @app.post("/concate_and_append_request")
    async def concate_and_append_request(request: Request) -> JSONResponse:
        """SGLang's frontend calls this when a fork joins with mode="concate_and_append" (parallel encoding),
        then sends the joined text with its next /generate. SGLang's old server spliced the forks' KV into one
        sequence; here that next request finds the forks' shared prefix in the radix tree and computes the
        rest exactly, so the route checks the body and acknowledges."""
        body = parse_body(
            ConcatAndAppendRequest, await read_body(request, config.max_request_body_bytes)
        )
        return JSONResponse({"success": True, "src_rids": body.src_rids, "dst_rid": body.dst_rid})

    @app.api_route("/start_profile", methods=["GET", "POST"])
    async def start_profile(request: Request) -> JSONResponse:
        raw = (
            await read_body(request, config.max_request_body_bytes)
            if request.method == "POST"
            else b""
        )
        body = parse_body(ProfileRequest, raw or b"{}")
        return await _profile_answer(
            ProfileReq(action="start", output_dir=body.output_dir, num_steps=body.num_steps)
        )

    @app.api_route("/stop_profile", methods=["GET", "POST"])
    async def stop_profile() -> JSONResponse:
        return await _profile_answer(ProfileReq(action="stop"))

    async def _profile_answer(msg: ProfileReq) -> JSONResponse:
        out = await tm.profile(msg)
        if out.success:
            return JSONResponse({"success": True, "message": out.message})
        return JSONResponse(error_body(out.message, code=400), 400)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        try:
            metrics.update_from_server_info(await tm.server_info(timeout=5.0))
        except APIError:
            pass  # still serve the counters this process has
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_openai_routes(app, tm, served_model_name)
    add_pin_routes(app, tm)
    add_cache_routes(app, tm)
    add_tokenize_routes(app, tm)
    guard = BrowserGuard(config.host, config.port, config.allowed_hosts, config.allowed_origins)
    app.add_middleware(GateMiddleware, api_key=config.api_key, metrics=metrics, guard=guard)
    return app


async def _stream_generate(
    handle: RequestHandle, results: list[SequenceResult], output: Any, intervals: list[int]
) -> AsyncIterator[bytes]:
    """SGLang streaming: each event holds the cumulative text/output_ids of one sequence and the output
    logprobs added since its previous event; a sequence sends an event every stream_interval tokens."""
    sent_ids = [0] * len(results)
    sent_logprobs = [0] * len(results)
    try:
        async for idx, _out, failed in accumulate(handle, results):
            if failed is not None:
                yield failed
                break
            res = results[idx]
            if len(res.output_ids) - sent_ids[idx] >= intervals[idx] or res.finished:
                yield sse(output(idx, sent_logprobs[idx]))
                sent_ids[idx], sent_logprobs[idx] = len(res.output_ids), len(res.output_logprobs)
    except APIError as e:
        yield sse(e.body())
    finally:
        handle.close()
    yield SSE_DONE
