"""What the server reports about itself: GET /health, /get_model_info (/model_info),
/get_server_info (/server_info) and the Prometheus /metrics. The replicas behind sglang-router
answer the router's questions with these.

/get_server_info shows the whole config and the session ids only to a request carrying the admin
key (--admin-api-key): the config names the operator's paths, and a session id is what continues
(or closes) another tenant's session. Everyone else gets the model, the limits a client works
within, and the scheduler's live counters (counts, none naming a request or a tenant).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixrt.runtime.serving.auth_levels import is_admin
from radixrt.runtime.serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from radixrt.runtime.serving.protocol import APIError, error_body
from radixrt.runtime.serving.tokenizer_manager import TokenizerManager


def add_status_routes(
    app: FastAPI, tm: TokenizerManager, served_model_name: str, metrics: ServerMetrics
) -> None:
    config = tm.config
    scheduler = tm.scheduler

    @app.get("/health")
    async def health() -> Response:
        if await scheduler.health_probe():
            return Response(status_code=200)
        reason = scheduler.dead_reason or "the scheduler did not answer the health probe"
        return JSONResponse(error_body(reason, "server_error", code=503), 503)

    @app.get("/get_model_info")
    @app.get("/model_info")  # SGLang serves both names
    async def get_model_info() -> dict[str, Any]:
        # the chat template travels too, so a client (the DSL over HTTP or sgl.OpenAI) renders roles
        # as we do
        tok = tm.tokenizer
        return {
            **scheduler.model_info,
            "served_model_name": served_model_name,
            "tokenizer_path": config.model_path,
            "chat_template": getattr(tok, "chat_template", None),
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info(request: Request) -> dict[str, Any]:
        info = await scheduler.server_info()
        live = {
            "num_inflight_requests": len(scheduler.states),
            "served_model_name": served_model_name,
        }
        if is_admin(request):
            return {**admin_config_view(config), **info, **live}
        limits = {k: getattr(config, k) for k in CLIENT_LIMITS}
        # the model's, if unset
        limits["context_length"] = scheduler.model_info.get("context_length")
        hidden = ADMIN_ONLY_INFO | (CACHE_FIGURES if config.admin_api_key is not None else set())
        shown = {k: v for k, v in info.items() if k not in hidden}
        return {**limits, **shown, **live}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        try:
            metrics.update_from_server_info(await scheduler.server_info(timeout=5.0))
        except APIError:
            pass  # still serve the counters this process has
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


# the config fields a client works within; the rest of the config is the admin's
CLIENT_LIMITS = (
    "max_running_requests",
    "max_prompts_per_request",
    "max_request_body_bytes",
    "request_timeout",
    "chunked_prefill_size",
)
# the scheduler's figures that name tenants' requests (session ids) or carry an error's text
ADMIN_ONLY_INFO = frozenset({"sessions", "error"})
# exact figures of the cache: their change around one's own request tells how much of it was cached
# (at page size 1, token by token) or how many new pages it added. Like the routes of level
# ADMIN_OPTIONAL (/metrics among them), they are the admin's when an admin key is set.
CACHE_FIGURES = frozenset(
    {
        "cache_hit_rate",
        "cached_tokens",
        "prompt_tokens",
        "prompt_tokens_computed",
        "kv_pages_cached",
        "kv_pages_evictable",
        "kv_pages_free",
        "num_pinned_tokens",
        "num_pins",
    }
)

SECRET_FIELDS = ("api_key", "admin_api_key", "disaggregation_secret")  # masked even for the admin


def admin_config_view(config: Any) -> dict[str, Any]:
    """The whole config, a set key shown as "***"."""
    cfg = dataclasses.asdict(config)
    for name in SECRET_FIELDS:
        if cfg.get(name) is not None:
            cfg[name] = "***"
    return cfg
