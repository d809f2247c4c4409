"""A chat answer with tools as OpenAI's stream chunks (openai_chat_tools.py's ToolRun): the role
chunk per choice, the thinking as reasoning_content deltas, content, each call's id and name, then
its argument fragments, the finish reason, usage, [DONE]."""

from __future__ import annotations

from typing import Any, AsyncIterator

from radixrt.runtime.serving.http.http_io import SSE_DONE, sse
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.openai_api.chat_reasoning import Reasoning
from radixrt.runtime.serving.openai_api.tool_parsers import ArgsDelta, CallEnd, CallStart, Content


async def tool_run_sse(run: Any, cbase: dict[str, Any]) -> AsyncIterator[bytes]:
    """run: a started ToolRun; cbase: every chunk's id, object, created and model."""
    opts = run.req.stream_options
    continuous = opts is not None and opts.continuous_usage_stats

    def chunk(idx: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {
            **cbase,
            "choices": [{"index": idx, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if continuous:
            obj["usage"] = run.usage()
        return sse(obj)

    try:
        for i in range(run.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for idx, events in run.events():
            for e in events:
                if isinstance(e, Reasoning):
                    yield chunk(idx, {"reasoning_content": e.text})
                elif isinstance(e, Content) and e.text:
                    yield chunk(idx, {"content": e.text})
                elif isinstance(e, CallStart):
                    call = run.calls[idx][e.index]
                    yield chunk(
                        idx,
                        {
                            "tool_calls": [
                                {
                                    "index": e.index,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": e.name, "arguments": ""},
                                }
                            ]
                        },
                    )
                elif isinstance(e, ArgsDelta):
                    yield chunk(
                        idx,
                        {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]},
                    )
                elif isinstance(e, CallEnd):
                    pass  # OpenAI has no event for it: the last chunk carries the finish reason
            if run.finish[idx] is not None:
                yield chunk(idx, {}, run.finish[idx])
        if opts is not None and opts.include_usage:
            yield sse({**cbase, "choices": [], "usage": run.usage()})
    except APIError as e:
        yield sse(e.body())
    finally:
        run.close()
    yield SSE_DONE
