"""One Responses request's generation, through the chat route's machinery: the body as a chat
request (chat_request), its prompt (prompt_for: with previous_response_id, the previous request's
exact ids and then only the new part), and the run (ResponseRun: plain text through
OpenAIRoutes.prepare, tools through openai_chat_tools.ToolRun), whose events build the output items
(responses_stream.OutputBuilder); Job: the Response object as it ends (completed, incomplete,
failed, cancelled) and what storing it keeps for a continuation.

A continuation's prompt is the previous response's last request's prompt + output ids, then the
tokens of what the conversation's render adds after the previous answer: the close of that answer's
turn (the part of the template's turn end the output did not already end with), the new input, the
generation prompt. Re-tokenising the whole conversation could split the old text differently (and
the template renders a tool call from its parsed arguments, not as generated): these ids are the
ones the radix cache holds, so the new request computes only its new tokens. This path is taken only
when the renders agree: the conversation up to the previous answer renders (with today's
instructions and tools) starting with the previous prompt's text, and the whole conversation
renders starting with that; otherwise the whole render is tokenised, as any chat request.
"""

from __future__ import annotations

import time
from array import array
from typing import Any, AsyncIterator

from pydantic import ValidationError

from radixrt.runtime.serving.http.http_io import accumulate, raise_error
from radixrt.runtime.serving.http.protocol import APIError, ChatCompletionRequest
from radixrt.runtime.serving.openai_api import responses_items as items
from radixrt.runtime.serving.openai_api.chat_reasoning import ChatReasoning, has_grammar
from radixrt.runtime.serving.openai_api.openai_chat_tools import ToolRun
from radixrt.runtime.serving.openai_api.responses_protocol import ResponsesRequest
from radixrt.runtime.serving.openai_api.responses_store import ResponsesStore, StoredResponse
from radixrt.runtime.serving.openai_api.responses_stream import OutputBuilder
from radixrt.runtime.serving.openai_api.tool_parsers.events import Content

SENTINEL = "\u2063radixrt-turn-end\u2063"  # a probe's assistant content, to find the turn's end
TAIL_TOKENS = 16  # output tokens kept as text to see how much of the turn's end they hold


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request a Responses body asks for (instructions first, as a system message)."""
    if req.instructions:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "tools": items.chat_tools(req.tools),
        "tool_choice": items.chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": items.response_format(req.text),
        "stream": req.stream,
        "cache_salt": req.cache_salt,
        **req.sampling_extras(),
    }
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}
        )
    except ValidationError as e:  # the items were checked: a field the chat request refuses
        first = e.errors()[0]
        where = str(first["loc"][0]) if first["loc"] else "input"
        raise APIError(f"{where}: {first['msg']}", param=where) from None


def _overlap(tail: str, closing: str) -> int:
    """How much of closing's start tail already ends with."""
    for k in range(min(len(tail), len(closing)), 0, -1):
        if tail.endswith(closing[:k]):
            return k
    return 0


class Prompts:
    """Renders and tokenises for a route (the turn-end probe made once per server)."""

    def __init__(self, chat: Any):
        self.chat = chat  # ChatRoute (openai_chat.py)
        self._closing: str | None = None

    async def closing(self) -> str:
        """What the template writes after an assistant message's content ("" when unknown)."""
        if self._closing is None:
            probe = ChatCompletionRequest.model_validate(
                {
                    "messages": [
                        {"role": "user", "content": "x"},
                        {"role": "assistant", "content": SENTINEL},
                    ],
                    "add_generation_prompt": False,
                }
            )
            try:
                text = await self.chat.prompt_text(probe, None)
            except APIError:
                text = ""
            at = text.rfind(SENTINEL)
            self._closing = text[at + len(SENTINEL) :] if at >= 0 else ""
        return self._closing

    async def prompt_for(
        self, creq: ChatCompletionRequest, plan: Any, suffix: str, prev: Any, num_old: int
    ) -> tuple[list[int], str]:
        """(prompt ids, the conversation's render). prev: the stored response continued
        (responses_store.StoredResponse) or None; num_old: creq's messages up to its answer."""
        text = await self.chat.prompt_text(creq, plan)
        if prev is not None and len(prev.transcript_ids):
            old = creq.model_copy(
                update={"messages": creq.messages[:num_old], "add_generation_prompt": False}
            )
            closed = await self.chat.prompt_text(old, plan)
            closing = await self.closing()
            if closing and closed.startswith(prev.prompt_text) and text.startswith(closed):
                new = closing[_overlap(prev.tail_text, closing) :] + text[len(closed) :] + suffix
                return list(prev.transcript_ids) + (await self.chat.tm.encode([new]))[0], text
        return (await self.chat.tm.encode([text + suffix]))[0], text


class ResponseRun:
    """The generation of one response: started once, its events read once, closed once."""

    def __init__(self, chat: Any, creq: ChatCompletionRequest, plan: Any, client: str):
        self.chat, self.routes, self.creq, self.plan, self.client = (
            chat,
            chat.routes,
            creq,
            plan,
            client,
        )
        self.builder = OutputBuilder()
        # a reasoning parser's thinking (--reasoning-parser) becomes a reasoning item
        self.thinking = ChatReasoning(chat.tm, creq, constrained=has_grammar(creq, plan))
        self.tool_run: ToolRun | None = None
        self.handle: Any = None
        self.results: list[Any] = []
        self.prompt: list[int] = []
        self.prompt_tokens = 0
        self.finish: str | None = None

    @property
    def uses_tools(self) -> bool:
        return self.plan is not None and self.plan.mode != "none"

    async def start(self, prompt: list[int], max_tokens: int | None) -> None:
        """Submit (a bad request is a 4xx here, before anything is answered)."""
        self.prompt = prompt
        if self.uses_tools:
            options = self.routes.request_options(
                self.creq, self.client, reasoning_end_ids=self.thinking.end_ids
            )
            self.tool_run = ToolRun(
                self.chat,
                self.creq,
                self.plan,
                prompt,
                max_tokens,
                options,
                self.client,
                self.thinking,
            )
            await self.tool_run.start()
            return
        options = self.routes.request_options(
            self.creq, self.client, reasoning_end_ids=self.thinking.end_ids
        )
        try:
            self.handle, self.results, self.prompt_tokens = await self.routes.prepare(
                self.creq, [prompt], max_tokens, options
            )
        except APIError as e:  # text.format's schema is the chat route's json_schema
            if e.param in ("json_schema", "ebnf") and self.creq.response_format is not None:
                e.param = "text.format.schema" if e.param == "json_schema" else "text.format"
            raise

    async def events(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The stream events of the output as it is generated (failures raise APIError)."""
        if self.tool_run is not None:
            async for _, parsed in self.tool_run.events():
                yield self.builder.feed(parsed)
            self.finish = self.tool_run.finish[0]
            return
        async for idx, out, failed in accumulate(self.handle, self.results):
            res = self.results[idx]
            if failed is not None:
                raise_error(res)
            reasoning, content = self.thinking.feed(0, out.get("text", ""), res.finished)
            events = self.builder.reasoning(reasoning) if reasoning else []
            yield events + (self.builder.feed([Content(content)]) if content else [])
            if res.finished:
                self.finish = self.routes.finish_reason(res)

    def outcome(self) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
        """(status, incomplete_details, error) once the events are read."""
        if self.finish in ("stop", "tool_calls"):
            return "completed", None, None
        if self.finish == "length":
            return "incomplete", {"reason": "max_output_tokens"}, None
        message = "the request was aborted before it finished"
        return "failed", None, {"code": "server_error", "message": message}

    def usage(self) -> dict[str, Any]:
        if self.tool_run is not None:
            return items.usage(self.tool_run.usage())
        chat_usage = self.routes.usage(self.results, self.prompt_tokens)
        return items.usage(chat_usage, self.thinking.reasoning_tokens(self.results))

    def transcript(self) -> tuple[list[int], list[int]]:
        """(the last request's prompt + output ids, its output ids): what the cache holds."""
        if self.tool_run is not None:
            res, prompt = self.tool_run.phase_results[-1][0], self.tool_run.phase_prompt
        else:
            res, prompt = self.results[0], self.prompt
        return prompt + res.output_ids, res.output_ids

    def close(self) -> None:
        """Abort whatever is unfinished (never awaits)."""
        if self.tool_run is not None:
            self.tool_run.close()
        elif self.handle is not None:
            self.handle.close()


class Job:
    """A response being answered: its run, the Response object so far, and what storing it takes."""

    def __init__(
        self,
        store: ResponsesStore,
        req: ResponsesRequest,
        run: ResponseRun,
        response: dict[str, Any],
        owner: str,
        history: list[dict[str, Any]],
        prompt_text: str,
    ):
        self.store, self.req, self.run, self.response = store, req, run, response
        self.owner, self.history, self.prompt_text = owner, history, prompt_text

    def finish(self, cancelled: bool = False) -> list[dict[str, Any]]:
        """The closing stream events; the final Response object is self.response (stored)."""
        status, incomplete, error = self.run.outcome()
        if cancelled:
            status, incomplete, error = "cancelled", None, None
        events = self.run.builder.finish("completed" if status == "completed" else "incomplete")
        self.response.update(
            status=status,
            output=self.run.builder.items,
            usage=self.run.usage(),
            incomplete_details=incomplete,
            error=error,
            completed_at=int(time.time()),
        )
        self.save(only_if_present=cancelled)
        return events

    def fail(self, e: APIError) -> list[dict[str, Any]]:
        events = self.run.builder.finish("incomplete")
        code = "server_error" if e.status >= 500 else "invalid_prompt"
        self.response.update(
            status="failed",
            output=self.run.builder.items,
            error={"code": code, "message": e.message},
        )
        self.save()
        return events

    def save(self, only_if_present: bool = False) -> None:
        if not self.req.store:
            return
        ids, output_ids = self.run.transcript() if self.response["status"] != "failed" else ([], [])
        tokenizer = self.run.chat.tm.tokenizer
        # what was said, cut or not; a call cut short has no arguments to render
        outputs = [
            it
            for it in self.response["output"]
            if it["type"] != "function_call" or it.get("status") != "incomplete"
        ]
        entry = StoredResponse(
            self.owner,
            dict(self.response),
            conversation=self.history + items.input_messages(outputs),
            prompt_text=self.prompt_text,
            transcript_ids=array("i", ids),
            tail_text=tokenizer.decode(output_ids[-TAIL_TOKENS:], skip_special_tokens=False),
        )
        self.store.put(self.response["id"], entry, only_if_present=only_if_present)
