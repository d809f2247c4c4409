"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models.

Each choice is one scheduler request (n is expanded into rid-i by the tokenizer manager);
choice index = prompt index * n + copy. Chat prompts go through the model's own chat template.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixrt.runtime.request_edge import SequenceResult
from radixrt.runtime.serving.protocol import (
    SSE_DONE, APIError, ChatCompletionRequest, accumulate, collect_results, CompletionRequest, parse_body, read_body,
    sampling_dict, sse)
from radixrt.runtime.serving.request_handle import RequestHandle
from radixrt.runtime.serving.tokenizer_manager import TokenizerManager

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def finish_reason(res: SequenceResult) -> str | None:
    return None if res.finished_reason is None else _FINISH.get(res.finished_reason.get("type"), "stop")


def matched_stop(res: SequenceResult) -> Any:
    return (res.finished_reason or {}).get("matched")


class OpenAIRoutes:
    def __init__(self, tm: TokenizerManager, served_model_name: str):
        self.tm = tm
        self.model_name = served_model_name

    def check_model(self, name: str | None) -> None:
        accepted = {None, "default", self.model_name, self.tm.config.model_path}
        if name not in accepted:
            raise APIError(f"the model {name!r} does not exist; this server serves {self.model_name!r}", 404,
                           param="model", code="model_not_found")

    def default_max_tokens(self, prompt_len: int) -> int:
        return max(0, min(self.tm.context_len, self.tm.pool_tokens) - prompt_len)

    def token_str(self, tid: int) -> str:
        return self.tm.tokenizer.decode([tid])

    # ---------------------------------------------------------------- logprobs in OpenAI's two shapes
    def completion_logprobs(self, lps: list, tops: list, start: int, num_top: int) -> dict[str, Any]:
        tokens = [self.token_str(t) for _, t in lps[start:]]
        offsets, pos = [], 0
        for s in tokens:
            offsets.append(pos)
            pos += len(s)
        return {"tokens": tokens, "token_logprobs": [_lp(lp) for lp, _ in lps[start:]],
                "top_logprobs": [{self.token_str(t): _lp(lp) for lp, t in top[:num_top]} for top in tops[start:]]
                if num_top else None,
                "text_offset": offsets}

    def chat_logprobs(self, lps: list, tops: list, start: int) -> dict[str, Any]:
        def entry(lp: Any, tid: int) -> dict[str, Any]:
            s = self.token_str(tid)
            return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode())}

        return {"content": [{**entry(lp, t), "top_logprobs": [entry(*x) for x in top]}
                            for (lp, t), top in zip(lps[start:], tops[start:])], "refusal": None}

    # ---------------------------------------------------------------- shared request flow
    async def _prepare(self, req: Any, prompts: list[list[int]], max_tokens: int | None, return_logprob: bool,
                 top_logprobs: int) -> tuple[RequestHandle, list[SequenceResult], int]:
        reqs = []
        for ids in prompts:
            max_new = self.default_max_tokens(len(ids)) if max_tokens is None else max_tokens
            sp = await self.tm.validate_sampling(sampling_dict(req, max_new))
            reqs += self.tm.make_requests(ids, sp, stream=req.stream, return_logprob=return_logprob,
                                          top_logprobs_num=top_logprobs)
        handle = self.tm.generate(reqs)
        return handle, [SequenceResult(r.rid) for r in reqs], sum(len(p) for p in prompts)

    @staticmethod
    def usage(results: list[SequenceResult], prompt_tokens: int) -> dict[str, Any]:
        completion = sum(r.completion_tokens for r in results)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)}}

    async def run(self, request: Request, handle: RequestHandle, results: list[SequenceResult]) -> None:
        await collect_results(request, handle, results)

    async def stream(self, handle: RequestHandle, results: list[SequenceResult], first: list[bytes],
                     chunk: Any, usage_chunk: Any) -> AsyncIterator[bytes]:
        """SSE: the opening chunks, one chunk per delta, finish chunks, usage, [DONE]. Errors become an
        error event; a client that goes away cancels this generator and `close` aborts the rest."""
        lp_sent = [0] * len(results)  # logprobs already sent per choice (held-back text sends none)
        try:
            for b in first:
                yield b
            async for idx, out, failed in accumulate(handle, results):
                if failed is not None:
                    yield failed
                    break
                res = results[idx]
                if out.get("text") or res.finished:
                    yield sse(chunk(idx, res, out.get("text", ""), lp_sent[idx]))
                    lp_sent[idx] = len(res.output_logprobs)
            else:
                if usage_chunk is not None:
                    yield sse(usage_chunk())
        except APIError as e:
            yield sse(e.body())
        finally:
            handle.close()
        yield SSE_DONE

    # ---------------------------------------------------------------- /v1/completions
    async def completions(self, request: Request) -> Any:
        req: CompletionRequest = parse_body(CompletionRequest, await read_body(request, self.tm.config.max_request_body_bytes))
        self.check_model(req.model)
        if req.best_of not in (None, req.n):
            raise APIError("best_of other than n is not supported", param="best_of")
        if req.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if req.echo and req.logprobs is not None:
            raise APIError("echo together with logprobs is not supported", param="echo")
        p = req.prompt
        if isinstance(p, str):
            prompts = await self.tm.encode([p])
        elif p and all(isinstance(x, str) for x in p):
            prompts = await self.tm.encode(list(p))
        elif p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]
        else:
            prompts = [list(x) for x in p]
        if not prompts:
            raise APIError("prompt is empty", param="prompt")
        num_top = req.logprobs or 0
        handle, results, prompt_tokens = await self._prepare(req, prompts, req.max_tokens, req.logprobs is not None, num_top)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}
        echo = [self.tm.tokenizer.decode(ids) if req.echo else "" for ids in prompts for _ in range(req.n)]

        def choice(i: int, res: SequenceResult, text: str, start: int) -> dict[str, Any]:
            lp = self.completion_logprobs(res.output_logprobs, res.output_top_logprobs, start, num_top) \
                if req.logprobs is not None else None
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish_reason(res),
                    "matched_stop": matched_stop(res)}

        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            first = [sse({**base, "choices": [choice(i, r, echo[i], 0)]}) for i, r in enumerate(results) if echo[i]]
            gen = self.stream(
                handle, results, first,
                lambda i, res, text, start: {**base, "choices": [choice(i, res, text, start)]},
                (lambda: {**base, "choices": [], "usage": self.usage(results, prompt_tokens)}) if include_usage else None)
            return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)
        await self.run(request, handle, results)
        return {**base, "choices": [choice(i, r, echo[i] + r.text, 0) for i, r in enumerate(results)],
                "usage": self.usage(results, prompt_tokens)}

    # ---------------------------------------------------------------- /v1/chat/completions
    async def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
        if req.continue_final_message and msgs[-1]["role"] != "assistant":
            raise APIError("continue_final_message needs the last message to be from the assistant", param="messages")
        try:
            text = self.tm.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message)
        except Exception as e:  # the template itself refuses (e.g. roles out of order)
            raise APIError(f"the chat template rejected the messages: {e}", param="messages") from None
        return (await self.tm.encode([text]))[0]

    async def chat(self, request: Request) -> Any:
        req: ChatCompletionRequest = parse_body(
            ChatCompletionRequest, await read_body(request, self.tm.config.max_request_body_bytes))
        self.check_model(req.model)
        if req.tools:
            raise APIError("tools are not supported", param="tools")
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs to be true", param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        handle, results, prompt_tokens = await self._prepare(req, [await self.chat_prompt(req)], max_tokens, req.logprobs,
                                                       req.top_logprobs or 0)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "created": created, "model": self.model_name}

        def lp(res: SequenceResult, start: int) -> dict[str, Any] | None:
            return self.chat_logprobs(res.output_logprobs, res.output_top_logprobs, start) if req.logprobs else None

        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            cbase = {**base, "object": "chat.completion.chunk"}
            first = [sse({**cbase, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})
                     for i in range(len(results))]

            def chunk(i: int, res: SequenceResult, text: str, start: int) -> dict[str, Any]:
                delta = {"content": text} if text else {}
                return {**cbase, "choices": [{"index": i, "delta": delta, "logprobs": lp(res, start),
                                              "finish_reason": finish_reason(res), "matched_stop": matched_stop(res)}]}

            gen = self.stream(handle, results, first, chunk,
                              (lambda: {**cbase, "choices": [], "usage": self.usage(results, prompt_tokens)})
                              if include_usage else None)
            return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)
        await self.run(request, handle, results)
        return {**base, "object": "chat.completion",
                "choices": [{"index": i, "message": {"role": "assistant", "content": r.text},
                             "logprobs": lp(r, 0), "finish_reason": finish_reason(r), "matched_stop": matched_stop(r)}
                            for i, r in enumerate(results)],
                "usage": self.usage(results, prompt_tokens)}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "radixrt", "root": self.tm.config.model_path,
                                            "max_model_len": self.tm.context_len}]}


def _lp(x: Any) -> float:
    return 0.0 if x is None else float(x)  # a token no distribution was computed for


def add_openai_routes(app: FastAPI, tm: TokenizerManager, served_model_name: str) -> OpenAIRoutes:
    routes = OpenAIRoutes(tm, served_model_name)
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", routes.chat, methods=["POST"])
    app.add_api_route("/v1/models", lambda: JSONResponse(routes.models()), methods=["GET"])
    return routes
