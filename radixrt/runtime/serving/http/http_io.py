"""How the routes read requests and send answers: a body read under a size limit, waiting only while
the client stays connected, and a request's results collected whole or streamed as SSE events (a
failed sequence becomes the HTTP error, or the error event a stream ends with).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, AsyncIterator

from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.protocol import APIError

logger = logging.getLogger(__name__)
CRASH_PREFIX = "internal error"  # how the scheduler and the detokenizer word an exception
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    import orjson

    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def json_response(obj: Any, status: int = 200) -> Any:
    """A whole answer encoded by orjson: a long answer (every position's logprobs with their
    alternatives) costs the event loop one C call, not FastAPI's per-item encoder and json.dumps."""
    import orjson
    from fastapi.responses import Response

    body = orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return Response(body, status, media_type="application/json")


async def read_body(request: Any, limit: int) -> bytes:
    """The request body, refusing (413) anything over limit bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(f"request body of {declared} bytes is over the limit of {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(f"request body is over the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


async def until_disconnect(request: Any, coro: Any) -> Any:
    """Await coro, but give up (cancel it, raise ClientGone) if the client disconnects first."""
    import asyncio

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled ourselves (shutdown): take the work down too
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


class ClientGone(Exception):
    """The client disconnected before the answer was ready (its requests are aborted)."""


def raise_error(res: SequenceResult) -> None:
    """A sequence that ended in an error becomes the HTTP error (400: refused, 503: server died).
    A crash inside the server (a 500 "internal error: <exception>", the scheduler's and the
    detokenizer's form) answers an error id: the exception's text, which may hold paths or another
    request's data, goes to the log."""
    if res.server_error:
        raise APIError(res.error or "the server failed", 503, "server_error")
    if res.error and res.error_status == 500 and res.error.startswith(CRASH_PREFIX):
        error_id = secrets.token_hex(6)
        logger.error("request %s failed (error id %s): %s", res.rid, error_id, res.error)
        message = f"internal error (error id {error_id}; the server's log has the detail)"
        raise APIError(message, res.error_status, "server_error")
    if res.error:
        kind = "server_error" if res.error_status >= 500 else "invalid_request_error"
        raise APIError(res.error, res.error_status, kind)


def error_event(res: SequenceResult) -> bytes | None:
    """The SSE event a stream ends with when this sequence failed (the body raise_error answers
    with)."""
    try:
        raise_error(res)
    except APIError as e:
        return sse(e.body())
    return None


async def accumulate(
    handle: Any, results: list[SequenceResult]
) -> AsyncIterator[tuple[int, dict, bytes | None]]:
    """A stream's deltas, each added to its sequence's result first: (index, delta, None), or
    (index, delta, the SSE error event) once, as the last item, when that sequence failed."""
    async for idx, out in handle:
        results[idx].add(out)
        failed = error_event(results[idx])
        yield idx, out, failed
        if failed is not None:
            return


async def collect_results(request: Any, handle: Any, results: list["SequenceResult"]) -> None:
    """Accumulate a non-streamed request's deltas until every sequence finished (or the client
    left)."""

    async def collect() -> None:
        async for idx, out in handle:
            results[idx].add(out)
            if results[idx].finished:
                raise_error(results[idx])

    try:
        await until_disconnect(request, collect())
    finally:
        handle.close()
