"""/v1/chat/completions with tools (tool_calls.py plans them): the phases of one answer, the calls
an incremental parser (tool_parsers/) reads from the text, and those calls as OpenAI's message or
stream chunks.

`required` or a named function: grammar-constrained to Hermes-envelope calls from the first token
(read by ToolCallParser whatever --tool-call-parser says). `auto` with --tool-call-parser: free
text, read by that parser in the model's own format. `auto` without (one choice): free text with
`<tool_call>` as an extra stop string; if the model opens a call, a second phase continues from the
same prefix (a radix cache hit) constrained to calls. Stream and whole answers: the same parser.

Under --reasoning-parser the text goes through the thinking first (chat_reasoning.py): the thinking
becomes reasoning_content, only the answer reaches the tool-call parser, the call grammar starts
after the thinking, and with `auto` a `<tool_call>` written inside the thinking is not a call: the
answer resumes from there, free.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.http.http_io import (
    SSE_HEADERS,
    accumulate,
    raise_error,
    until_disconnect,
)
from radixrt.runtime.serving.http.protocol import APIError, ChatCompletionRequest
from radixrt.runtime.serving.http.tenants import client_of
from radixrt.runtime.serving.openai_api import tool_calls
from radixrt.runtime.serving.openai_api.chat_reasoning import ChatReasoning, with_reasoning_usage
from radixrt.runtime.serving.openai_api.tool_parsers import (
    ArgsDelta,
    CallStart,
    Content,
    ToolCallParser,
    make_parser,
)
from radixrt.runtime.serving.openai_api.tool_parsers.hermes_stream import OPEN
from radixrt.runtime.serving.openai_api.tool_run_stream import tool_run_sse


async def answer_with_tools(
    chat: Any,
    request: Request,
    req: ChatCompletionRequest,
    plan: tool_calls.ToolPlan,
    prompt: list[int],
    max_tokens: int | None,
    thinking: ChatReasoning | None = None,
) -> Any:
    """The answer to a chat request whose tool_choice is not `none` (refusals first: a 400);
    thinking: the request's under --reasoning-parser."""
    if req.logprobs:
        raise APIError("logprobs together with tools is not supported", param="logprobs")
    rf = req.response_format
    if (
        (rf is not None and rf.type != "text")
        or req.regex is not None
        or req.json_schema is not None
        or req.ebnf is not None
    ):
        raise APIError(
            "tools cannot be combined with response_format, regex, json_schema or ebnf",
            param="tools",
        )
    if plan.mode == "auto" and chat.tm.config.tool_call_parser is None and req.n != 1:
        raise APIError(
            "tool_choice auto supports n = 1 only (use required or a named function)", param="n"
        )
    client = client_of(request, chat.tm.config, req.cache_salt)
    # built once: every phase's request carries the same options (no logprobs with tools)
    thinking = thinking or ChatReasoning(chat.tm, req)
    options = chat.routes.request_options(req, client, reasoning_end_ids=thinking.end_ids)
    run = ToolRun(chat, req, plan, prompt, max_tokens, options, client, thinking)
    await run.start()
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": chat.routes.model_name,
    }
    if req.stream:
        return StreamingResponse(
            tool_run_sse(run, {**base, "object": "chat.completion.chunk"}),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    try:

        async def drain() -> None:
            async for _ in run.events():
                pass

        await until_disconnect(request, drain())
    finally:
        run.close()
    return {
        **base,
        "object": "chat.completion",
        "choices": [run.choice(i) for i in range(run.n)],
        "usage": run.usage(),
    }


class ToolRun:
    """One chat request with tools: its phases, and per choice the parser and what it produced."""

    def __init__(
        self,
        chat: Any,  # ChatRoute (openai_chat.py): the tokenizer manager and OpenAIRoutes
        req: ChatCompletionRequest,
        plan: tool_calls.ToolPlan,
        prompt: list[int],
        max_tokens: int | None,
        options: RequestOptions,  # the body's (OpenAIRoutes.request_options), for every phase
        client: str | None = None,  # whom its requests count against (tenants.client_of)
        thinking: ChatReasoning | None = None,  # the thinking's split (--reasoning-parser)
    ):
        self.chat, self.req, self.plan, self.prompt = chat, req, plan, prompt
        self.max_tokens = max_tokens
        self.options = options
        self.client = client
        self.n = req.n
        # --tool-call-parser: an auto answer is free text in the model's own format (calls to
        # other tools than the request's are content); else what a grammar writes
        parser = chat.tm.config.tool_call_parser
        self.free = plan.mode == "auto" and parser is not None
        self.parsers = [
            make_parser(parser, plan.names) if self.free else ToolCallParser()
            for _ in range(self.n)
        ]
        self.content = [""] * self.n
        self.calls: list[list[dict[str, Any]]] = [[] for _ in range(self.n)]
        self.finish: list[str | None] = [None] * self.n
        self.phase_results: list[list[SequenceResult]] = []
        self.prompt_tokens = 0
        self.handle: Any = None
        self.thinking = thinking or ChatReasoning(chat.tm, req)

    async def start(self) -> None:
        """Phase 1 (refusals are a 400 before anything is sent)."""
        if self.free:
            extra: dict[str, Any] = {}  # the request's own sampling, its stop strings included
        elif self.plan.mode == "auto":
            # the call grammar of phase 2 is checked now, so a tool schema that cannot be enforced
            # is a 400 before any text is sent
            await self.chat.tm.validate_sampling(
                {"tool_call_grammar": self.plan.grammar(opened=True)}, self.client
            )
            extra = self._auto_extra()
        else:  # the whole answer is calls: the client's stop strings do not cut them
            extra = {"tool_call_grammar": self.plan.grammar(opened=False), "stop": []}
        await self._phase(self.prompt, self.max_tokens, extra)

    def _auto_extra(self) -> dict[str, Any]:
        """auto's free phase: the client's stop strings and the opening tag."""
        stop = (
            self.req.stop
            if isinstance(self.req.stop, list)
            else [self.req.stop] * (self.req.stop is not None)
        )
        return {"stop": [*stop, OPEN]}

    async def _phase(
        self,
        prompt: list[int],
        max_tokens: int | None,
        extra: dict[str, Any],
        options: RequestOptions | None = None,
    ) -> None:
        self.handle, results, prompt_tokens = await self.chat.routes.prepare(
            self.req, [prompt], max_tokens, options or self.options, extra=extra
        )
        self.phase_results.append(results)
        self.phase_prompt = prompt  # the last phase's (a Responses continuation starts with it)
        self.prompt_tokens = self.prompt_tokens or prompt_tokens

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()

    def _apply(self, idx: int, events: list) -> list:
        for e in events:
            if isinstance(e, Content):
                self.content[idx] += e.text
            elif isinstance(e, CallStart):
                self.calls[idx].append(
                    {
                        "id": tool_calls.new_call_id(),
                        "type": "function",
                        "function": {"name": e.name, "arguments": ""},
                    }
                )
            elif isinstance(e, ArgsDelta):
                self.calls[idx][e.index]["function"]["arguments"] += e.text
        return events

    async def events(self) -> AsyncIterator[tuple[int, list]]:
        """(choice, parser events) as the text arrives, through every phase; sets finish reasons."""
        may_open = self.plan.mode == "auto" and not self.free
        prompt, text, used = self.prompt, "", 0
        while True:
            reopen = None
            async for idx, events, opened in self._phase_events(may_open):
                reopen = opened or reopen
                yield idx, events
            if reopen is None:
                return
            self.handle.close()
            text, used = text + reopen.text + OPEN, used + reopen.completion_tokens
            text_ids = (await self.chat.tm.encode([text]))[0]
            left = None if self.max_tokens is None else max(1, self.max_tokens - used)
            if not self.thinking.in_reasoning(0):
                break
            # the tag was written inside the thinking: not a call; the answer goes on, free
            yield 0, self._split(0, OPEN, False)
            await self._phase(prompt + text_ids, left, self._auto_extra(), self.options)
        # the model opened a call: continue from the same prefix, constrained to calls from here;
        # the thinking (if any) is over, so the grammar starts at once
        yield 0, self._split(0, OPEN, False)
        await self._phase(
            prompt + text_ids,
            left,
            {"tool_call_grammar": self.plan.grammar(opened=True), "stop": []},
            self.chat.routes.request_options(self.req, self.client),  # the thinking is over
        )
        async for idx, events, _ in self._phase_events(False):
            yield idx, events

    def _split(self, idx: int, text: str, finished: bool) -> list:
        """Choice idx's new text as events: the thinking's, then the tool parser's (applied).
        required / named: the grammar writes calls only, so text outside them (a call cut short
        by max_tokens leaves part of its tag) is not content."""
        events = self.thinking.split_events(idx, text, finished, self.parsers[idx])
        if self.plan.mode in ("required", "named"):
            events = [e for e in events if not isinstance(e, Content)]
        return self._apply(idx, events)

    async def _phase_events(
        self, may_open: bool
    ) -> AsyncIterator[tuple[int, list, SequenceResult | None]]:
        """The current phase's (choice, events, the result that stopped at an opening tag or
        None)."""
        results = self.phase_results[-1]
        async for idx, out, failed in accumulate(self.handle, results):
            if failed is not None:
                raise_error(results[idx])
            res = results[idx]
            opened = may_open and (res.finished_reason or {}).get("matched") == OPEN
            ended = res.finished and not opened
            events = self._split(idx, out.get("text", ""), ended)
            if ended:  # before the events go out: a stream's last chunk carries the reason
                self._end(idx, res)
            yield idx, events, None
            if opened:
                yield idx, [], res

    def _end(self, idx: int, res: SequenceResult) -> None:
        done = self.parsers[idx].num_calls
        self.finish[idx] = (
            "tool_calls"
            if done and not self.parsers[idx].in_call
            else self.chat.routes.finish_reason(res)
        )

    def choice(self, i: int) -> dict[str, Any]:
        message = {"role": "assistant", "content": self.content[i] or None}
        if self.thinking.separate:
            message["reasoning_content"] = self.thinking.reasoning.get(i) or None
        if self.calls[i]:
            message["tool_calls"] = self.calls[i]
        return {"index": i, "message": message, "logprobs": None, "finish_reason": self.finish[i]}

    def usage(self) -> dict[str, Any]:
        everything = [r for phase in self.phase_results for r in phase]
        usage = self.chat.routes.usage(everything, self.prompt_tokens)
        usage["prompt_tokens_details"]["cached_tokens"] = sum(
            r.cached_tokens for r in self.phase_results[0]
        )
        if self.thinking.fmt is None:
            return usage
        # a choice's output is its phases' outputs one after the other (auto: phase 1 was choice 0)
        outputs = [
            [t for phase in self.phase_results if i < len(phase) for t in phase[i].output_ids]
            for i in range(self.n)
        ]
        thought = sum(self.thinking.tokens_of(i, ids) for i, ids in enumerate(outputs))
        return with_reasoning_usage(usage, thought)
