"""POST /generate, SGLang's native route: one prompt or a batch (text or input_ids), sampling params
and logprob options per prompt, n copies of each prompt one after another (SGLang's order). The
answer is one output or a list of them, whole or streamed (each event holds a sequence's output so
far)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.edge import per_prompt, rows_of
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.request.sequence_result import SequenceResult, expand_beams, generate_output
from radixrt.runtime.serving.http.http_io import (
    SSE_DONE,
    SSE_HEADERS,
    accumulate,
    collect_results,
    json_response,
    read_body,
    sse,
)
from radixrt.runtime.serving.http.pd_auth import check_bootstrap_auth
from radixrt.runtime.serving.http.protocol import (
    APIError,
    GenerateRequest,
    from_value_error,
    parse_body,
)
from radixrt.runtime.serving.http.request_handle import RequestHandle
from radixrt.runtime.serving.http.request_options import request_options
from radixrt.runtime.serving.http.tenants import client_of
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager


def add_generate_routes(app: FastAPI, tm: TokenizerManager) -> None:
    @app.post("/generate")
    async def generate(request: Request) -> Any:
        req: GenerateRequest = parse_body(
            GenerateRequest,
            await read_body(request, tm.config.max_request_body_bytes),
            lambda raw: tm.check_num_sequences(_rows_per_prompt(raw)),  # before validating it
        )
        check_bootstrap_auth(tm.config, request.headers, req.bootstrap())
        batch, prompts = await _prompts(tm, req)
        client = client_of(request, tm.config, req.cache_salt)
        reqs, flat_logprob = await _scheduler_requests(tm, req, prompts, client)
        many = batch or len(reqs) > 1
        handle = tm.generate(reqs)
        results = [SequenceResult(r.rid) for r in reqs]
        token_text = tm.token_text if req.return_text_in_logprobs else (lambda t: None)

        def output(i: int, logprobs_from: int = 0) -> dict[str, Any]:
            return generate_output(
                results[i], flat_logprob[i], token_text, i if many else None, logprobs_from
            )

        if req.stream:
            intervals = [r.sampling_params.get("stream_interval") or 1 for r in reqs]
            return StreamingResponse(
                _stream_generate(handle, results, output, intervals),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )

        await collect_results(request, handle, results)
        # a beam search's sequence is its returned beams, each an output of its own
        flat = [(i, one) for i, res in enumerate(results) for one in expand_beams(res)]
        many = many or len(flat) > 1
        outs = [
            generate_output(one, flat_logprob[i], token_text, k if many else None)
            for k, (i, one) in enumerate(flat)
        ]
        return json_response(outs if many else outs[0])


def _rows_per_prompt(raw: dict) -> Iterator[int]:
    """Each prompt's sequences as the parsed body states them (checked later, in full): n or a
    beam search's width; a value of the wrong type counts 1 and is refused by its own check."""
    prompts = raw.get("text") if raw.get("text") is not None else raw.get("input_ids")
    num = (
        len(prompts)
        if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int)
        else 1
    )
    params = raw.get("sampling_params")
    for i in range(num):
        p = params[i] if isinstance(params, list) and i < len(params) else params
        yield rows_of(p if isinstance(p, dict) else {})


async def _prompts(tm: TokenizerManager, req: GenerateRequest) -> tuple[bool, list[list[int]]]:
    """Whether the body is a batch, and its prompts as token ids."""
    if (req.text is None) == (req.input_ids is None):
        raise APIError("give exactly one of text and input_ids", param="text")
    if req.text is not None:
        batch = isinstance(req.text, list)
        prompts = await tm.encode(req.text if batch else [req.text], add_special_tokens=True)
    else:
        batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if batch else [req.input_ids]
    if not prompts:
        raise APIError("the batch is empty", param="text")
    return batch, prompts


async def _scheduler_requests(
    tm: TokenizerManager, req: GenerateRequest, prompts: list[list[int]], client: str
) -> tuple[list[TokenizedGenerateReq], list[bool]]:
    """The checked scheduler requests (n copies of prompt i follow each other, SGLang's order), and
    whether each returns logprobs; client: whom their grammar compiles count against."""
    num = len(prompts)
    try:
        params = per_prompt(req.sampling_params, num, "sampling_params")
        return_logprob = per_prompt(req.return_logprob, num, "return_logprob")
        starts = per_prompt(req.logprob_start_len, num, "logprob_start_len")
        tops = per_prompt(req.top_logprobs_num, num, "top_logprobs_num")
        loras = per_prompt(req.lora_path, num, "lora_path")
    except RequestError as e:
        raise from_value_error(e) from None
    options = [
        request_options(
            tm.config,
            req.bootstrap(),
            stream=req.stream,
            return_logprob=return_logprob[i],
            logprob_start_len=starts[i],
            top_logprobs_num=tops[i],
            program_id=req.program_id,
            session_id=req.session(),
            lora=loras[i],
            cache_salt=req.cache_salt,
            priority=req.priority,
            client=client,
        )
        for i in range(num)
    ]
    per_prompt_reqs = await tm.admit(prompts, params, options)
    reqs = [r for copies in per_prompt_reqs for r in copies]
    flat_logprob = [return_logprob[i] for i, copies in enumerate(per_prompt_reqs) for _ in copies]
    return reqs, flat_logprob


async def _stream_generate(
    handle: RequestHandle, results: list[SequenceResult], output: Any, intervals: list[int]
) -> AsyncIterator[bytes]:
    """SGLang streaming: each event holds the cumulative text/output_ids of one sequence and the
    output logprobs added since its previous event; a sequence sends an event every stream_interval
    tokens."""
    sent_ids = [0] * len(results)
    sent_logprobs = [0] * len(results)
    try:
        async for idx, _out, failed in accumulate(handle, results):
            if failed is not None:
                yield failed
                break
            res = results[idx]
            if len(res.output_ids) - sent_ids[idx] >= intervals[idx] or res.finished:
                yield sse(output(idx, sent_logprobs[idx]))
                sent_ids[idx], sent_logprobs[idx] = len(res.output_ids), len(res.output_logprobs)
    except APIError as e:
        yield sse(e.body())
    finally:
        handle.close()
    yield SSE_DONE
