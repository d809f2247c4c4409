"""OpenAI-compatible routes: GET /v1/models, and what POST /v1/completions (openai_completions.py)
and /v1/chat/completions (openai_chat.py) share: the model check, the ignored-fields header, request
preparation, usage, logprobs in OpenAI's two shapes, finish reasons, and the SSE stream of chunks.

Each choice is one scheduler request (n is expanded into rid-i by the tokenizer manager);
choice index = prompt index * n + copy. Chat prompts go through the model's own chat template.
"""

from __future__ import annotations

import logging
import re
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sequence_result import SequenceResult, expand_beams
from radixrt.runtime.serving.http.http_io import (
    SSE_DONE,
    accumulate,
    collect_results,
    json_response,
    sse,
)
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.http.request_handle import RequestHandle
from radixrt.runtime.serving.http.request_options import request_options
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager
from radixrt.runtime.serving.openai_api.openai_chat import ChatRoute
from radixrt.runtime.serving.openai_api.openai_completions import CompletionRoute
from radixrt.runtime.serving.openai_api.openai_responses import add_responses_routes
from radixrt.runtime.serving.openai_api.openai_sampling import beam_search_fields, sampling_dict

logger = logging.getLogger(__name__)
IGNORED_FIELDS_HEADER = "X-Radixrt-Ignored-Fields"
_FIELD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_WARNED = 256  # distinct ignored-field sets logged (then no more: a client cannot grow this set)
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class OpenAIRoutes:
    def __init__(self, tm: TokenizerManager, served_model_name: str):
        self.tm = tm
        self.model_name = served_model_name
        self._warned: set[tuple[str, ...]] = set()  # ignored-field sets already logged

    @staticmethod
    def finish_reason(res: SequenceResult) -> str | None:
        return (
            None
            if res.finished_reason is None
            else _FINISH.get(res.finished_reason.get("type"), "stop")
        )

    @staticmethod
    def matched_stop(res: SequenceResult) -> Any:
        return (res.finished_reason or {}).get("matched")

    def reply(self, req: Any, answer: Any) -> Any:
        """The route's answer, with the top-level fields it ignored named in a header (and logged
        once)."""
        # safe in a header
        ignored = [name for name in req.ignored_fields() if _FIELD_NAME.fullmatch(name)]
        if not isinstance(answer, Response):
            answer = json_response(answer)
        if not ignored:
            return answer
        if tuple(ignored) not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(tuple(ignored))
            logger.warning("OpenAI request fields ignored: %s", ", ".join(ignored))
        answer.headers[IGNORED_FIELDS_HEADER] = ",".join(ignored)[:1000]
        return answer

    def check_model(self, name: str | None) -> str | None:
        """The request's LoRA adapter (vLLM's and SGLang's ways: the adapter's name as the model,
        or "base:adapter"), None for the base model; a 404 for anything else."""
        accepted = {None, "default", self.model_name, self.tm.config.model_path}
        if name in accepted:
            return None
        base, _, adapter = name.rpartition(":")
        if adapter in self.tm.scheduler.lora_adapters and base in accepted | {""}:
            return adapter
        served = ", ".join([self.model_name, *self.tm.scheduler.lora_adapters])
        raise APIError(
            f"the model {name!r} does not exist; this server serves {served}",
            404,
            param="model",
            code="model_not_found",
        )

    def default_max_tokens(self, prompt_len: int, beam_width: int = 1) -> int:
        """What the rest of the context allows; a beam search: what its beams may all hold in
        the pool even unshared (edge.check_beam_request)."""
        room = max(0, min(self.tm.context_len, self.tm.pool_tokens) - prompt_len)
        if beam_width > 1:
            page = self.tm.limits.page_size
            room = min(room, max(1, (self.tm.pool_tokens - prompt_len) // beam_width - page))
        return room

    def token_str(self, tid: int) -> str:
        return self.tm.token_text(tid)

    # -------------------------------------------------------------- logprobs in OpenAI's two shapes
    def completion_logprobs(
        self, lps: list, tops: list, start: int, num_top: int
    ) -> dict[str, Any]:
        tokens = [self.token_str(t) for _, t in lps[start:]]
        offsets, pos = [], 0
        for s in tokens:
            offsets.append(pos)
            pos += len(s)
        return {
            "tokens": tokens,
            "token_logprobs": [_lp(lp) for lp, _ in lps[start:]],
            "top_logprobs": [
                {self.token_str(t): _lp(lp) for lp, t in top[:num_top]} for top in tops[start:]
            ]
            if num_top
            else None,
            "text_offset": offsets,
        }

    def chat_logprobs(self, lps: list, tops: list, start: int) -> dict[str, Any]:
        def entry(lp: Any, tid: int) -> dict[str, Any]:
            s = self.token_str(tid)
            return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode())}

        return {
            "content": [
                {**entry(lp, t), "top_logprobs": [entry(*x) for x in top]}
                for (lp, t), top in zip(lps[start:], tops[start:])
            ],
            "refusal": None,
        }

    # -------------------------------------------------------------- shared request flow
    def request_options(
        self,
        req: Any,
        client: str,
        return_logprob: bool = False,
        top_logprobs: int = 0,
        reasoning_end_ids: tuple[int, ...] | None = None,
    ) -> RequestOptions:
        """The options of an OpenAI body (serving/http/request_options.py): its LoRA adapter is the
        model it names (check_model), its bootstrap fields are checked; client: whom it counts
        against (tenants.client_of); reasoning_end_ids: the grammar waits for the end of the
        thinking (chat_reasoning.py)."""
        return request_options(
            self.tm.config,
            req.bootstrap(),
            stream=req.stream,
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs,
            session_id=req.session_id,
            lora=self.check_model(req.model),
            cache_salt=req.cache_salt,
            reasoning_end_ids=reasoning_end_ids,
            priority=req.priority,
            client=client,
        )

    async def prepare(
        self,
        req: Any,
        prompts: list[list[int]],
        max_tokens: int | None,
        options: RequestOptions,
        extra: dict[str, Any] | None = None,
    ) -> tuple[RequestHandle, list[SequenceResult], int]:
        """Check and submit: one scheduler request per prompt and copy, each with options
        (request_options); extra overrides sampling fields."""
        width = beam_search_fields(req).get("beam_width", 1)
        depth = self.tm.config.json_object_max_depth
        params = [
            {
                **sampling_dict(
                    req,
                    self.default_max_tokens(len(ids), width) if max_tokens is None else max_tokens,
                    depth,
                ),
                **(extra or {}),
            }
            for ids in prompts
        ]
        per_prompt_reqs = await self.tm.admit(prompts, params, [options] * len(prompts))
        reqs = [r for copies in per_prompt_reqs for r in copies]
        handle = self.tm.generate(reqs)
        return handle, [SequenceResult(r.rid) for r in reqs], sum(len(p) for p in prompts)

    @staticmethod
    def usage(results: list[SequenceResult], prompt_tokens: int) -> dict[str, Any]:
        completion = sum(r.completion_tokens for r in results)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)},
        }

    async def run(
        self, request: Request, handle: RequestHandle, results: list[SequenceResult]
    ) -> None:
        """Collect the whole answer; a beam search's sequence becomes its returned beams (each a
        choice)."""
        await collect_results(request, handle, results)
        results[:] = [one for res in results for one in expand_beams(res)]

    def usage_options(
        self, req: Any, base: dict[str, Any], results: list[SequenceResult], prompt_tokens: int
    ) -> tuple[Any, Any]:
        """stream_options -> (the final usage chunk's builder or None, the per-chunk usage builder
        or None: continuous_usage_stats puts the usage so far into every chunk)."""
        opts = req.stream_options
        usage = lambda: self.usage(results, prompt_tokens)  # noqa: E731
        final = (
            (lambda: {**base, "choices": [], "usage": usage()})
            if opts is not None and opts.include_usage
            else None
        )
        return final, usage if opts is not None and opts.continuous_usage_stats else None

    async def stream(
        self,
        handle: RequestHandle,
        results: list[SequenceResult],
        first: list[bytes],
        chunk: Any,
        usage_chunk: Any,
        usage_now: Any = None,
    ) -> AsyncIterator[bytes]:
        """SSE: the opening chunks, one chunk per delta, finish chunks, usage, [DONE]. Errors become
        an error event; a client that goes away cancels this generator and `close` aborts the
        rest."""
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
                    obj = chunk(idx, res, out.get("text", ""), lp_sent[idx])
                    if obj is None:  # all its text held back (a reasoning parser's tag, say)
                        continue
                    if usage_now is not None:
                        obj["usage"] = usage_now()
                    yield sse(obj)
                    lp_sent[idx] = len(res.output_logprobs)
            else:
                if usage_chunk is not None:
                    yield sse(usage_chunk())
        except APIError as e:
            yield sse(e.body())
        finally:
            handle.close()
        yield SSE_DONE

    def models(self) -> dict[str, Any]:
        # owned_by "sglang": what SGLang-aware tools and routers look for; each LoRA adapter is a
        # model of its own whose parent is the base (vLLM's listing)
        base = {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "sglang",
            "root": self.tm.config.model_path,
            "parent": None,
            "max_model_len": self.tm.context_len,
        }
        adapters = [
            {**base, "id": name, "root": name, "parent": self.model_name}
            for name in self.tm.scheduler.lora_adapters
        ]
        return {"object": "list", "data": [base, *adapters]}


def _lp(x: Any) -> float:
    return 0.0 if x is None else float(x)  # a token no distribution was computed for


def add_openai_routes(app: FastAPI, tm: TokenizerManager, served_model_name: str) -> OpenAIRoutes:
    routes = OpenAIRoutes(tm, served_model_name)
    app.add_api_route("/v1/completions", CompletionRoute(routes), methods=["POST"])
    chat = ChatRoute(routes)
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    add_responses_routes(app, routes, chat)  # /v1/responses (openai_responses.py)
    app.add_api_route("/v1/models", lambda: JSONResponse(routes.models()), methods=["GET"])
    return routes
