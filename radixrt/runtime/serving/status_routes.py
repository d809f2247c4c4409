"""What the server reports about itself: GET /health, /get_model_info (/model_info),
/get_server_info (/server_info) and the Prometheus /metrics. The replicas behind sglang-router
answer the router's questions with these."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from radixrt.runtime.serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from radixrt.runtime.serving.protocol import APIError, error_body
from radixrt.runtime.serving.tokenizer_manager import TokenizerManager


def add_status_routes(
    app: FastAPI, tm: TokenizerManager, served_model_name: str, metrics: ServerMetrics
) -> None:
    config = tm.config

    @app.get("/health")
    async def health() -> Response:
        if await tm.health_probe():
            return Response(status_code=200)
        reason = tm.dead_reason or "the scheduler did not answer the health probe"
        return JSONResponse(error_body(reason, "server_error", code=503), 503)

    @app.get("/get_model_info")
    @app.get("/model_info")  # SGLang serves both names
    async def get_model_info() -> dict[str, Any]:
        # the chat template travels too, so a client (the DSL over HTTP or sgl.OpenAI) renders roles
        # as we do
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

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        try:
            metrics.update_from_server_info(await tm.server_info(timeout=5.0))
        except APIError:
            pass  # still serve the counters this process has
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
