"""SGLang's routes for LoRA adapters at run time: POST /load_lora_adapter (lora_name, lora_path) and
/unload_lora_adapter (lora_name); both answer with the adapters served afterwards (docs/lora.md).
A load reads only under --lora-dir (model/lora_paths.py), up to --max-loaded-loras adapters, off
the scheduler's loop (lora_loads.py); this request waits for the answer."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from radixrt.runtime.messages import LoraAdapterOut, LoraAdapterReq
from radixrt.runtime.serving.http.http_io import read_body
from radixrt.runtime.serving.http.protocol import (
    APIError,
    LoraAdapterRequest,
    error_body,
    parse_body,
)
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager


def add_lora_routes(app: FastAPI, tm: TokenizerManager) -> None:
    config = tm.config
    scheduler = tm.scheduler

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        """SGLang's: serve the PEFT adapter at lora_path as lora_name."""
        body = parse_body(
            LoraAdapterRequest, await read_body(request, config.max_request_body_bytes)
        )
        if not body.lora_path:
            raise APIError("lora_path is required to load an adapter", param="lora_path")
        msg = LoraAdapterReq("load", body.lora_name, body.lora_path)
        return _lora_answer(await scheduler.lora_adapter(msg))

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        body = parse_body(
            LoraAdapterRequest, await read_body(request, config.max_request_body_bytes)
        )
        msg = LoraAdapterReq("unload", body.lora_name)
        return _lora_answer(await scheduler.lora_adapter(msg))

    def _lora_answer(out: LoraAdapterOut) -> JSONResponse:
        if out.success:
            return JSONResponse(
                {"success": True, "message": out.message, "loaded_adapters": out.adapters}
            )
        return JSONResponse(error_body(out.message, param=out.param, code=400), 400)
