"""POST /v1/chat/completions: the messages through the model's own chat template, and plain answers
(whole or streamed). A request with tools is answered by openai_chat_tools.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.http_io import SSE_HEADERS, read_body, sse
from radixrt.runtime.serving.http.pd_auth import check_bootstrap_auth
from radixrt.runtime.serving.http.protocol import APIError, ChatCompletionRequest, parse_body
from radixrt.runtime.serving.http.request_handle import RequestHandle
from radixrt.runtime.serving.http.tenants import client_of
from radixrt.runtime.serving.openai_api import tool_calls
from radixrt.runtime.serving.openai_api.chat_reasoning import (
    ChatReasoning,
    has_grammar,
    with_reasoning_usage,
)
from radixrt.runtime.serving.openai_api.openai_chat_tools import answer_with_tools

# apply_chat_template's own arguments: never from a client (chat_template would be arbitrary Jinja)
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "tools",
        "documents",
        "conversation",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
        "messages",
    }
)


class ChatRoute:
    def __init__(self, routes: Any):
        # OpenAIRoutes: model check, request preparation, usage, logprobs, finish reasons
        self.routes = routes
        self.tm = routes.tm

    async def prompt_ids(
        self, req: ChatCompletionRequest, plan: tool_calls.ToolPlan | None, suffix: str = ""
    ) -> list[int]:
        """The messages through the chat template, then suffix (the opened thinking of a
        constrained reasoning request: chat_reasoning.py)."""
        return (await self.tm.encode([await self.prompt_text(req, plan) + suffix]))[0]

    async def prompt_text(
        self, req: ChatCompletionRequest, plan: tool_calls.ToolPlan | None
    ) -> str:
        """The messages through the chat template, as text (openai_responses.py compares the
        renders of a conversation and its continuation)."""
        # each message renders to 2 tokens at least (its role's markers): more than half the
        # context's worth cannot fit, and is refused before the render (30,000 grew this process
        # by ~80 MB that it kept)
        most = self.tm.context_len // 2
        if len(req.messages) > most:
            raise APIError(
                f"{len(req.messages)} messages: their prompt cannot fit the context of "
                f"{self.tm.context_len} tokens (at most {most} messages)",
                param="messages",
            )
        msgs = [m.as_dict() for m in req.messages]
        if req.continue_final_message and msgs[-1]["role"] != "assistant":
            raise APIError(
                "continue_final_message needs the last message to be from the assistant",
                param="messages",
            )
        kwargs = dict(req.chat_template_kwargs or {})
        reserved = sorted(
            k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS or k.startswith("return_")
        )
        # a client's own template (Jinja) or tokenizer options would run on the event loop
        if reserved:
            raise APIError(
                f"chat_template_kwargs may not set {', '.join(reserved)}",
                param="chat_template_kwargs",
            )
        tokenizer = self.tm.tokenizer
        if req.tools and tool_calls.template_renders_tools(tokenizer):
            kwargs["tools"] = req.tools
        else:
            msgs = tool_calls.fallback_messages(msgs, plan)
        try:
            # on a thread: the render (Jinja, pure Python) grows with the client's messages and
            # tools, and a thread gives the loop the GIL back every few milliseconds (#41)
            text = await asyncio.to_thread(
                tokenizer.apply_chat_template,
                msgs,
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                **kwargs,
            )
        except Exception as e:  # the template itself refuses (e.g. roles out of order)
            raise APIError(
                f"the chat template rejected the messages: {e}", param="messages"
            ) from None
        return text

    async def __call__(self, request: Request) -> Any:
        req: ChatCompletionRequest = parse_body(
            ChatCompletionRequest, await read_body(request, self.tm.config.max_request_body_bytes)
        )
        check_bootstrap_auth(self.tm.config, request.headers, req.bootstrap())
        return self.routes.reply(req, await self.answer(request, req))

    async def answer(self, request: Request, req: ChatCompletionRequest) -> Any:
        self.routes.check_model(req.model)
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs to be true", param="top_logprobs")
        plan = tool_calls.plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
        thinking = ChatReasoning(self.tm, req, constrained=has_grammar(req, plan))
        prompt = await self.prompt_ids(req, plan, thinking.prompt_suffix)
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        if plan is not None and plan.mode != "none":
            if req.use_beam_search:
                raise APIError(
                    "use_beam_search cannot be combined with tools", param="use_beam_search"
                )
            return await answer_with_tools(self, request, req, plan, prompt, max_tokens, thinking)
        options = self.routes.request_options(
            req,
            client_of(request, self.tm.config, req.cache_salt),
            req.logprobs,
            req.top_logprobs or 0,
            thinking.end_ids,
        )
        handle, results, prompt_tokens = await self.routes.prepare(
            req, [prompt], max_tokens, options
        )
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.routes.model_name,
        }
        if req.stream:
            cbase = {**base, "object": "chat.completion.chunk"}
            return self.stream(req, cbase, handle, results, prompt_tokens, thinking)
        await self.routes.run(request, handle, results)
        return {
            **base,
            "object": "chat.completion",
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", **thinking.message(r.text)},
                    "logprobs": self.logprobs(req, r, 0),
                    "finish_reason": self.routes.finish_reason(r),
                    "matched_stop": self.routes.matched_stop(r),
                }
                for i, r in enumerate(results)
            ],
            "usage": self.usage(results, prompt_tokens, thinking),
        }

    def usage(
        self, results: list[SequenceResult], prompt_tokens: int, thinking: ChatReasoning
    ) -> dict[str, Any]:
        usage = self.routes.usage(results, prompt_tokens)
        if thinking.fmt is None:  # no --reasoning-parser
            return usage
        return with_reasoning_usage(usage, thinking.reasoning_tokens(results))

    def logprobs(
        self, req: ChatCompletionRequest, res: SequenceResult, start: int
    ) -> dict[str, Any] | None:
        """A choice's logprobs from output token `start` on, when the request asked for them."""
        return (
            self.routes.chat_logprobs(res.output_logprobs, res.output_top_logprobs, start)
            if req.logprobs
            else None
        )

    def stream(
        self,
        req: ChatCompletionRequest,
        cbase: dict[str, Any],
        handle: RequestHandle,
        results: list[SequenceResult],
        prompt_tokens: int,
        thinking: ChatReasoning,
    ) -> StreamingResponse:
        """A plain answer as chunks: each choice opens with the assistant role, then one chunk per
        delta (the thinking as reasoning_content deltas under a reasoning parser)."""
        first = [
            sse(
                {
                    **cbase,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for i in range(len(results))
        ]

        def chunk(i: int, res: SequenceResult, text: str, start: int) -> dict[str, Any] | None:
            delta = thinking.delta(i, text, res.finished) if text or res.finished else {}
            if not delta and not res.finished:
                return None  # all of it held back (part of a tag)
            return {
                **cbase,
                "choices": [
                    {
                        "index": i,
                        "delta": delta,
                        "logprobs": self.logprobs(req, res, start),
                        "finish_reason": self.routes.finish_reason(res),
                        "matched_stop": self.routes.matched_stop(res),
                    }
                ],
            }

        final, usage_now = self.routes.usage_options(req, cbase, results, prompt_tokens)
        if thinking.fmt is not None:  # the usage chunks count the thinking too
            usage = lambda: self.usage(results, prompt_tokens, thinking)  # noqa: E731
            final = final and (lambda: {**cbase, "choices": [], "usage": usage()})
            usage_now = usage_now and usage
        gen = self.routes.stream(handle, results, first, chunk, final, usage_now)
        return StreamingResponse(gen, media_type="text/event-stream", headers=SSE_HEADERS)
