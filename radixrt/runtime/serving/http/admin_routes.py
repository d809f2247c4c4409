"""What an operator or SGLang's frontend asks the server to do: POST /flush_cache, /start_profile
and /stop_profile (POST only, unlike SGLang's: any web page can make a browser send a GET), and
POST /concate_and_append_request (SGLang's fork join, checked and acknowledged). Their keys:
auth_levels.py."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from radixrt.runtime.messages import ProfileReq
from radixrt.runtime.serving.backend.step_profiler import check_output_dir, profile_root
from radixrt.runtime.serving.http.http_io import read_body
from radixrt.runtime.serving.http.protocol import (
    APIError,
    ConcatAndAppendRequest,
    ProfileRequest,
    error_body,
    parse_body,
)
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager


def add_admin_routes(app: FastAPI, tm: TokenizerManager) -> None:
    config = tm.config

    @app.post("/flush_cache")  # state-changing routes are POST only
    async def flush_cache() -> JSONResponse:
        ok = await tm.scheduler.flush_cache()
        if ok:
            return JSONResponse({"success": True, "message": "cache flushed"})
        return JSONResponse(error_body("cache not flushed: requests are running", code=400), 400)

    @app.post("/concate_and_append_request")
    async def concate_and_append_request(request: Request) -> JSONResponse:
        """SGLang's frontend calls this when a fork joins with mode="concate_and_append" (parallel
        encoding), then sends the joined text with its next /generate. SGLang's old server spliced
        the forks' KV into one sequence; here that next request finds the forks' shared prefix in
        the radix tree and computes the rest exactly, so the route checks the body and
        acknowledges."""
        body = parse_body(
            ConcatAndAppendRequest, await read_body(request, config.max_request_body_bytes)
        )
        return JSONResponse({"success": True, "src_rids": body.src_rids, "dst_rid": body.dst_rid})

    @app.post("/start_profile")
    async def start_profile(request: Request) -> JSONResponse:
        raw = await read_body(request, config.max_request_body_bytes)
        body = parse_body(ProfileRequest, raw or b"{}")
        try:  # traces only inside --profile-dir (the scheduler checks again where it writes)
            check_output_dir(body.output_dir, profile_root(config))
        except ValueError as e:
            raise APIError(str(e), param="output_dir") from None
        return await _profile_answer(
            ProfileReq(action="start", output_dir=body.output_dir, num_steps=body.num_steps)
        )

    @app.post("/stop_profile")
    async def stop_profile() -> JSONResponse:
        return await _profile_answer(ProfileReq(action="stop"))

    async def _profile_answer(msg: ProfileReq) -> JSONResponse:
        out = await tm.scheduler.profile(msg)
        if out.success:
            return JSONResponse({"success": True, "message": out.message})
        return JSONResponse(error_body(out.message, code=400), 400)
