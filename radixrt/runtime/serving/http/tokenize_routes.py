"""POST /tokenize and /detokenize (SGLang's and vLLM's routes): the server's own tokenizer over
HTTP, so a client (the DSL's RuntimeEndpoint among them) counts and splits text exactly as the
server will. POST /separate_reasoning (SGLang's): a text's thinking and answer, split by a reasoning
parser (reasoning_parser.py)."""

from __future__ import annotations

from typing import Any, Union

from fastapi import FastAPI, Request

from radixrt.runtime.serving.http.http_io import read_body
from radixrt.runtime.serving.http.protocol import APIError, _Strict, parse_body
from radixrt.runtime.serving.openai_api.reasoning_parser import NAMES, reasoning_format, separate

# The tokenizer holds the GIL while it decodes (~0.4 us a token), so a thread would not free the
# event loop: a longer list is refused before decoding (~50 ms at the bound); split it (#41)
MAX_DETOKENIZE_TOKENS = 1 << 17


class TokenizeRequest(_Strict):
    text: Union[str, list[str], None] = None
    prompt: Union[str, list[str], None] = None  # vLLM's name for it
    add_special_tokens: bool = True
    model: str | None = None


class SeparateReasoningRequest(_Strict):
    text: str
    reasoning_parser: str | None = None  # default: the server's --reasoning-parser


class DetokenizeRequest(_Strict):
    tokens: list[int]
    skip_special_tokens: bool = False
    model: str | None = None


def add_tokenize_routes(app: FastAPI, tm: Any) -> None:
    limit = tm.config.max_request_body_bytes

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        req: TokenizeRequest = parse_body(TokenizeRequest, await read_body(request, limit))
        if (req.text is None) == (req.prompt is None):
            raise APIError("give exactly one of text and prompt", param="text")
        text = req.text if req.text is not None else req.prompt
        ids = await tm.encode(
            text if isinstance(text, list) else [text], add_special_tokens=req.add_special_tokens
        )
        tokens = ids if isinstance(text, list) else ids[0]
        return {"tokens": tokens, "count": sum(map(len, ids)), "max_model_len": tm.context_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        req: DetokenizeRequest = parse_body(DetokenizeRequest, await read_body(request, limit))
        if len(req.tokens) > MAX_DETOKENIZE_TOKENS:
            raise APIError(
                f"tokens must be at most {MAX_DETOKENIZE_TOKENS} token ids, got "
                f"{len(req.tokens)}: split the list",
                param="tokens",
            )
        vocab = int(tm.scheduler.model_info["vocab_size"])
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(
                f"tokens must be token ids in [0, {vocab}), got {bad[:3]}", param="tokens"
            )
        text = tm.tokenizer.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)
        return {"text": text, "prompt": text}

    @app.post("/separate_reasoning")
    async def separate_reasoning(request: Request) -> dict[str, Any]:
        req = parse_body(SeparateReasoningRequest, await read_body(request, limit))
        name = req.reasoning_parser or tm.config.reasoning_parser
        if name not in NAMES:
            raise APIError(
                f"reasoning_parser must be one of {', '.join(NAMES)}"
                + ("" if name else " (this server has no --reasoning-parser)"),
                param="reasoning_parser",
            )
        reasoning, text = separate(reasoning_format(name), req.text)
        return {"text": text, "reasoning_text": reasoning}
