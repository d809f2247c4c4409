"""OpenAI's Responses API, as SGLang and vLLM serve it: POST /v1/responses (whole, streamed as the
SDK's typed events, or in the background), GET /v1/responses/{id}, POST /v1/responses/{id}/cancel.

A request is the chat route's machinery underneath (responses_run.py): its items become chat
messages (responses_items.py), rendered by the model's chat template, tools run by ToolRun and
text.format by the chat route's response_format. Answers are stored (responses_store.py) unless
`store` is false; `previous_response_id` continues a stored conversation from the exact ids the
radix cache holds. GET and cancel take the tenant's salt in an `X-Cache-Salt` header (or, as
before, the `cache_salt` query parameter, which URLs and their logs carry).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixrt.runtime.request.option_checks import check_cache_salt
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.serving.http.http_io import SSE_HEADERS, read_body, until_disconnect
from radixrt.runtime.serving.http.protocol import APIError, from_value_error, parse_body
from radixrt.runtime.serving.http.tenants import client_of
from radixrt.runtime.serving.openai_api import responses_items as items
from radixrt.runtime.serving.openai_api import tool_calls
from radixrt.runtime.serving.openai_api.responses_protocol import ResponsesRequest
from radixrt.runtime.serving.openai_api.responses_run import Job, Prompts, ResponseRun, chat_request
from radixrt.runtime.serving.openai_api.responses_store import (
    ResponsesStore,
    StoredResponse,
    new_response_id,
    owner_of,
)
from radixrt.runtime.serving.openai_api.responses_stream import SSEWriter

logger = logging.getLogger(__name__)
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}
CANCEL_WAIT_S = 10.0  # how long a cancel waits for the run to write its last state


class ResponsesRoute:
    def __init__(self, routes: Any, chat: Any, store: ResponsesStore | None = None):
        self.routes, self.chat, self.tm = routes, chat, routes.tm  # OpenAIRoutes, ChatRoute
        self.store = store or ResponsesStore()
        self.prompts = Prompts(chat)
        self._tasks: set[asyncio.Task] = set()  # background responses running

    async def create(self, request: Request) -> Any:
        body = await read_body(request, self.tm.config.max_request_body_bytes)
        req: ResponsesRequest = parse_body(ResponsesRequest, body)
        return self.routes.reply(req, await self.answer(request, req))

    async def answer(self, request: Request, req: ResponsesRequest) -> Any:
        self.routes.check_model(req.model)
        items.check_metadata(req.metadata)
        _check_modes(req)
        owner = owner_of(request, self.tm.config, req.cache_salt)
        prev = self._previous(req, owner)
        old = prev.conversation if prev is not None else []
        history = old + items.input_messages(req.input)
        if not history:
            raise APIError("input is empty (and no previous_response_id)", param="input")
        creq = chat_request(req, history)
        try:
            plan = tool_calls.plan_tools(creq.tools, creq.tool_choice, creq.parallel_tool_calls)
        except APIError as e:  # named as the chat route's tools: say it in the Responses shape
            e.message = e.message.replace(".function.", ".")
            raise
        run = ResponseRun(self.chat, creq, plan, client_of(request, self.tm.config, req.cache_salt))
        num_old = len(old) + bool(req.instructions)
        ids, text = await self.prompts.prompt_for(
            creq, plan, run.thinking.prompt_suffix, prev, num_old
        )
        await run.start(ids, req.max_output_tokens)
        job = Job(self.store, req, run, self.skeleton(req, creq), owner, history, text)
        if req.background:
            return self.background(job)
        if req.stream:
            return StreamingResponse(
                self.stream(job), media_type="text/event-stream", headers=SSE_HEADERS
            )
        try:
            await until_disconnect(request, _drain(run))
        finally:
            run.close()
        job.finish()
        return job.response

    def _previous(self, req: ResponsesRequest, owner: str) -> StoredResponse | None:
        if req.previous_response_id is None:
            return None
        prev = self.store.get(req.previous_response_id, owner)
        if prev is None:
            raise APIError(
                f"no response {req.previous_response_id!r} (unknown, expired, not stored, or "
                "another tenant's)",
                404,
                param="previous_response_id",
                code="response_not_found",
            )
        status = prev.response.get("status")
        if status not in ("completed", "incomplete"):
            raise APIError(
                f"the previous response is {status}: only a completed or incomplete one can be "
                "continued",
                param="previous_response_id",
            )
        return prev

    def skeleton(self, req: ResponsesRequest, creq: Any) -> dict[str, Any]:
        """The Response object before any output: the request's fields echoed."""
        fmt = req.text.format if req.text is not None else None
        return {
            "id": new_response_id(),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": req.model or self.routes.model_name,
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
            "instructions": req.instructions,
            "metadata": req.metadata or {},
            "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "tools": items.echo_tools(creq.tools),
            "tool_choice": req.tool_choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "text": {
                "format": {"type": "text"}
                if fmt is None
                else fmt.model_dump(by_alias=True, exclude_none=True)
            },
            "previous_response_id": req.previous_response_id,
            "background": req.background,
            "user": req.user,
            "truncation": req.truncation or "disabled",
            "reasoning": req.reasoning,
        }

    async def stream(self, job: Job) -> AsyncIterator[bytes]:
        write = SSEWriter()
        try:
            yield write({"type": "response.created", "response": dict(job.response)})
            yield write({"type": "response.in_progress", "response": dict(job.response)})
            async for events in job.run.events():
                for event in events:
                    yield write(event)
            for event in job.finish():
                yield write(event)
            kind = TERMINAL.get(job.response["status"], "response.failed")
        except APIError as e:
            for event in job.fail(e):
                yield write(event)
            kind = "response.failed"
        finally:
            job.run.close()
        yield write({"type": kind, "response": job.response})

    # ------------------------------------------------------------------ background
    def background(self, job: Job) -> dict[str, Any]:
        entry = StoredResponse(job.owner, dict(job.response))
        self.store.put(job.response["id"], entry)
        task = asyncio.ensure_future(self._background(job))
        entry.task = task
        self._tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            if task.cancelled():  # cancelled before its first step: its handler never ran
                job.run.close()
                job.finish(cancelled=True)

        task.add_done_callback(done)
        return dict(job.response)

    async def _background(self, job: Job) -> None:
        try:
            await _drain(job.run)
            job.finish()
        except asyncio.CancelledError:  # cancelled (the route) or evicted (only_if_present)
            job.run.close()
            job.finish(cancelled=True)
        except APIError as e:
            job.fail(e)
        except Exception:
            logger.exception("background response %s failed", job.response["id"])
            job.fail(APIError("internal error (the server's log has the detail)", 500))
        finally:
            job.run.close()

    # ------------------------------------------------------------------ GET, cancel
    def _entry(self, request: Request, response_id: str) -> StoredResponse:
        # the salt in a header (X-Cache-Salt), which proxies and access logs do not record as they
        # do a URL's query; the query parameter is still read when no header is given
        salt = request.headers.get("x-cache-salt") or request.query_params.get("cache_salt")
        try:  # the body's rule for the salt (bounded), on the header and the query parameter too
            check_cache_salt(salt)
        except RequestError as e:
            raise from_value_error(e) from None
        entry = self.store.get(response_id, owner_of(request, self.tm.config, salt))
        if entry is None:
            raise APIError(
                f"no response {response_id[:128]!r} (unknown, expired, not stored, or another "
                "tenant's)",
                404,
                "not_found_error",
                param="response_id",
                code="response_not_found",
            )
        return entry

    async def retrieve(self, request: Request, response_id: str) -> Any:
        return self._entry(request, response_id).response

    async def cancel(self, request: Request, response_id: str) -> Any:
        entry = self._entry(request, response_id)
        if not entry.response.get("background"):
            raise APIError("only a background response can be cancelled", param="response_id")
        if not entry.running or entry.task is None:
            raise APIError(
                f"the response is {entry.response.get('status')}: only one in progress can be "
                "cancelled",
                param="response_id",
            )
        entry.task.cancel()  # its request is aborted; it stores itself as cancelled
        await asyncio.wait({entry.task}, timeout=CANCEL_WAIT_S)
        return self._entry(request, response_id).response


async def _drain(run: ResponseRun) -> None:
    async for _ in run.events():
        pass


def _check_modes(req: ResponsesRequest) -> None:
    if req.background and not req.store:
        raise APIError("background needs store to be true", param="background")
    if req.background and req.stream:
        raise APIError("background responses are not streamed here", param="stream")
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text" and req.tools and req.tool_choice != "none":
        raise APIError(
            "text.format (json_object, json_schema) cannot be combined with tools",
            param="text.format",
        )


def add_responses_routes(app: FastAPI, routes: Any, chat: Any) -> ResponsesRoute:
    responses = ResponsesRoute(routes, chat)
    app.add_api_route("/v1/responses", responses.create, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"])
    return responses
