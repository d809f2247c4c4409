"""POST /v1/completions: OpenAI's legacy text completions. The prompt is a text, a list of texts,
token ids or a list of token id lists; each choice is one sequence (index = prompt index * n +
copy), with the prompt echoed in front when asked and logprobs in the completions shape."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any, Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.http_io import SSE_HEADERS, read_body, sse
from radixrt.runtime.serving.http.pd_auth import check_bootstrap_auth
from radixrt.runtime.serving.http.protocol import APIError, CompletionRequest, parse_body
from radixrt.runtime.serving.http.tenants import client_of
from radixrt.runtime.serving.openai_api.openai_sampling import beam_search_fields


class CompletionRoute:
    def __init__(self, routes: Any):
        # OpenAIRoutes: model check, request preparation, usage, logprobs, finish reasons
        self.routes = routes
        self.tm = routes.tm

    async def __call__(self, request: Request) -> Any:
        req: CompletionRequest = parse_body(
            CompletionRequest,
            await read_body(request, self.tm.config.max_request_body_bytes),
            lambda raw: self.tm.check_num_sequences(rows_stated(raw)),  # before validating it
        )
        check_bootstrap_auth(self.tm.config, request.headers, req.bootstrap())
        return self.routes.reply(req, await self.answer(request, req))

    async def prompts(self, req: CompletionRequest) -> list[list[int]]:
        """The token ids of each prompt, whichever of the four shapes the request used."""
        p = req.prompt
        if isinstance(p, str):
            prompts = await self.tm.encode([p], add_special_tokens=True)
        elif p and all(isinstance(x, str) for x in p):
            prompts = await self.tm.encode(list(p), add_special_tokens=True)
        elif p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]
        else:
            prompts = [list(x) for x in p]
        if not prompts:
            raise APIError("prompt is empty", param="prompt")
        return prompts

    def choice(
        self, req: CompletionRequest, i: int, res: SequenceResult, text: str, start: int
    ) -> dict[str, Any]:
        """Choice i with `text`, and its logprobs from output token `start` on."""
        lp = (
            self.routes.completion_logprobs(
                res.output_logprobs, res.output_top_logprobs, start, req.logprobs or 0
            )
            if req.logprobs is not None
            else None
        )
        return {
            "index": i,
            "text": text,
            "logprobs": lp,
            "finish_reason": self.routes.finish_reason(res),
            "matched_stop": self.routes.matched_stop(res),
        }

    async def answer(self, request: Request, req: CompletionRequest) -> Any:
        self.routes.check_model(req.model)
        if req.suffix:
            raise APIError("suffix is not supported", param="suffix")
        if req.echo and req.logprobs is not None:
            raise APIError("echo together with logprobs is not supported", param="echo")
        p = req.prompt
        num_prompts = 1 if isinstance(p, str) or (p and isinstance(p[0], int)) else len(p)
        rows = max(req.n, beam_search_fields(req).get("beam_width", 1))
        self.tm.check_num_sequences(itertools.repeat(rows, num_prompts))  # before tokenizing
        prompts = await self.prompts(req)
        options = self.routes.request_options(
            req,
            client_of(request, self.tm.config, req.cache_salt),
            req.logprobs is not None,
            req.logprobs or 0,
        )
        handle, results, prompt_tokens = await self.routes.prepare(
            req, prompts, req.max_tokens, options
        )
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        base = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": self.routes.model_name,
        }
        echo = [
            self.tm.tokenizer.decode(ids) if req.echo else ""
            for ids in prompts
            for _ in range(req.n)
        ]
        if req.stream:
            first = [
                sse({**base, "choices": [self.choice(req, i, r, echo[i], 0)]})
                for i, r in enumerate(results)
                if echo[i]
            ]
            gen = self.routes.stream(
                handle,
                results,
                first,
                lambda i, res, text, start: {
                    **base,
                    "choices": [self.choice(req, i, res, text, start)],
                },
                *self.routes.usage_options(req, base, results, prompt_tokens),
            )
            return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)
        await self.routes.run(request, handle, results)
        return {
            **base,
            "choices": [self.choice(req, i, r, echo[i] + r.text, 0) for i, r in enumerate(results)],
            "usage": self.routes.usage(results, prompt_tokens),
        }


def rows_stated(raw: dict) -> Iterator[int]:
    """Each prompt's sequences as the parsed body states them, at least (n; a beam search's width
    and best_of are checked once the body is validated): a value of the wrong type counts 1."""
    p = raw.get("prompt")
    num = len(p) if isinstance(p, list) and p and not isinstance(p[0], int) else 1
    n = raw.get("n")
    return itertools.repeat(n if isinstance(n, int) and n > 1 else 1, num)
