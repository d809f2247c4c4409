"""What the server reports about itself: GET /health, /get_model_info (/model_info),
/get_server_info (/server_info) and the Prometheus /metrics. The replicas behind sglang-router
answer the router's questions with these.

/get_server_info shows the whole config and the session ids only to a request carrying the admin
key (--admin-api-key): the config names the operator's paths, and a session id is what continues
(or closes) another tenant's session. Everyone else gets the model, the limits a client works
within and an allowlist of the scheduler's figures (CLIENT_INFO: sizes and load, none naming a
request or a tenant, none that moves with what the cache holds); the rest of the figures (the
cache's, the second tier's, the KV transfers') are the admin's once an admin key is set, and open
to every caller only on a server without one, like the other ADMIN_OPTIONAL routes (/metrics).
An allowlist, so a figure added later stays the admin's until someone decides a client may see it.
/get_model_info names no path: model_path and tokenizer_path are the served model name, except
for the admin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixrt.runtime.serving.http.auth_levels import is_admin
from radixrt.runtime.serving.http.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from radixrt.runtime.serving.http.protocol import APIError, error_body
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager


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
    async def get_model_info(request: Request) -> dict[str, Any]:
        # the chat template travels too, so a client (the DSL over HTTP or sgl.OpenAI) renders roles
        # as we do; SGLang's clients pick a template by model_path, which the served name serves
        tok = tm.tokenizer
        path = config.model_path if is_admin(request) else served_model_name
        return {
            **scheduler.model_info,
            "model_path": path,
            "served_model_name": served_model_name,
            "tokenizer_path": path,
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
        if config.admin_api_key is not None:
            shown = {k: v for k, v in info.items() if k in CLIENT_INFO}
        else:
            shown = {k: v for k, v in info.items() if k not in ADMIN_ONLY_INFO}
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
# the scheduler's figures that name tenants' requests (session ids) or carry an error's text: the
# admin's alone, with or without an admin key
ADMIN_ONLY_INFO = frozenset({"sessions", "error"})
# what any client may see of the scheduler's figures once an admin key is set: the pool's size and
# layout, the adapters served, the load (how many requests run and wait), integrity. Nothing whose
# change around one's own request tells how much of it was cached or how many pages it added (at
# page size 1, token by token): the cache's figures, the second tier's hicache_*, the decode side's
# kv_transfer_*, prompt and generated token totals, pins, sessions' counts.
CLIENT_INFO = frozenset(
    {
        "integrity_ok",
        "integrity_checked_at",
        "kv_pages_total",
        "page_size",
        "lora_adapters",
        "max_loras_per_batch",
        "max_total_tokens",
        "kv_bytes_per_token",
        "kv_pool_bytes",
        "kv_cache_dtype",
        "disaggregation_mode",
        "num_running",
        "num_waiting",
    }
)

# masked even for the admin
SECRET_FIELDS = (
    "api_key",
    "admin_api_key",
    "disaggregation_secret",
    "disaggregation_channel_secret",
)


def admin_config_view(config: Any) -> dict[str, Any]:
    """The whole config, a set key shown as "***"."""
    cfg = dataclasses.asdict(config)
    for name in SECRET_FIELDS:
        if cfg.get(name) is not None:
            cfg[name] = "***"
    return cfg
