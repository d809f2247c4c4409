"""The main process's side of the runtime: tokenize, run the request edge, send, and route the text
deltas back.

The request edge (request/edge.admit: every check, then n-expansion) runs here for every route, so a
bad request is a 4xx and never reaches the scheduler. Each scheduler request (one per sequence: n>1
is expanded into rid-0..rid-{n-1}) has a state whose queue receives its text deltas. The manager
holds a `SchedulerClient` (.scheduler, scheduler_client.py: the sockets, the routing of deltas,
heartbeats, admin round trips); a `RequestHandle` (request_handle.py) iterates the deltas of one
HTTP request and aborts whatever is unfinished when it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from typing import Any, AsyncIterator, Iterable

from radixrt.runtime import messages
from radixrt.runtime.cache_tree_text import add_previews
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.edge import (
    STOP_REGEX,
    EdgeRules,
    admit,
    check_sampling,
    needs_compile,
    rows_of,
)
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.prompt_checks import EdgeLimits
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.request.stop_regex_check import StopRegexChecker
from radixrt.runtime.serving.http.metrics import ServerMetrics
from radixrt.runtime.serving.http.protocol import APIError, from_value_error
from radixrt.runtime.serving.http.request_handle import ReqState, RequestHandle
from radixrt.runtime.serving.http.scheduler_client import SchedulerClient
from radixrt.runtime.serving.http.tenants import CompileShares, check_in_flight


class TokenizerManager:
    def __init__(
        self,
        config: ServerConfig,
        scheduler_path: str,
        tokenizer_path: str,
        metrics: ServerMetrics | None = None,
    ):
        from radixrt.runtime.model.weights import load_tokenizer

        self.config = config
        self.scheduler = SchedulerClient(config, scheduler_path, tokenizer_path, metrics)
        self.tokenizer = load_tokenizer(config.model_path)
        self._rid_prefix = uuid.uuid4().hex[:8]
        self._rid_counter = itertools.count()
        self._grammar = None
        self._compiles = CompileShares()  # grammar compiles queued at the edge, per client
        self._stop_regex = StopRegexChecker(config.grammar_compile_memory_mb)
        self._token_texts: list[str] = []  # token_text's table, filled at start

    async def start(self, procs: dict[str, Any], timeout: float = 600.0) -> None:
        """Open the sockets, wait until every child process reported ready (model load: 10-40 s),
        build the constraint check, then route what the scheduler sends."""
        await self.scheduler.connect(procs, timeout)
        # ~0.5 s: walks the vocabulary
        self._grammar = await asyncio.to_thread(self._make_grammar_backend)
        self._token_texts = await asyncio.to_thread(self._decode_vocabulary)
        self.scheduler.start_loops()

    async def close(self) -> None:
        for backend in self._grammar.built() if self._grammar is not None else []:
            backend.shutdown()
        self._stop_regex.shutdown()
        await self.scheduler.close()

    # ------------------------------------------------------------------ requests
    @property
    def context_len(self) -> int:
        return int(self.scheduler.model_info["context_length"])

    @property
    def pool_tokens(self) -> int:
        info = self.scheduler.startup_server_info
        return int(
            info.get("max_total_tokens") or info["kv_pages_total"] * info.get("page_size", 1)
        )

    def new_rid(self) -> str:
        return f"{self._rid_prefix}-{next(self._rid_counter)}"

    async def encode(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        """Token ids of each text. Raw prompts (/generate, /v1/completions) pass
        add_special_tokens=True: the BOS token exactly when the tokenizer's config says to add one,
        as transformers does; a chat template's text already carries its own. Long inputs are
        tokenized on a worker thread so one huge prompt does not stall every other stream."""

        def run() -> list[list[int]]:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

        return run() if sum(len(t) for t in texts) < 20_000 else await asyncio.to_thread(run)

    async def validate_sampling(
        self, params: dict[str, Any] | None, client: str | None = None
    ) -> SamplingParams:
        """A sampling dict checked as the edge checks it (request/edge.check_sampling), alone: a
        constraint a later phase of the request will use (openai_chat_tools.py)."""
        try:
            if not needs_compile(params):
                return check_sampling(params, self._validate)
            async with self._compile_share(client):
                return await asyncio.to_thread(check_sampling, params, self._validate)
        except ValueError as e:  # RequestError, or SamplingParams' own words
            raise from_value_error(e) from None

    async def admit(
        self, prompts: list[list[int]], params: list[Any], options: list[RequestOptions]
    ) -> list[list[TokenizedGenerateReq]]:
        """The request edge (request/edge.admit) over a body's prompts, one sampling dict and one
        options per prompt (built once by the route, http/request_options.py): each prompt's
        scheduler requests, or an APIError naming the field. It runs on the event loop when no
        sampling dict names anything to compile, else on a worker thread (a stop regex or a
        constraint compiles in the compile workers, up to their timeout: the loop, /health and
        every stream, never wait), counted in the client's share of compiles."""
        rules = EdgeRules(
            self.limits, tuple(self.scheduler.lora_adapters), self.config.disaggregation_mode
        )
        edge = (prompts, params, options, rules)
        try:
            if not any(needs_compile(p) for p in {id(p): p for p in params}.values()):
                return admit(*edge, new_rid=self.new_rid, validate=self._validate)
            async with self._compile_share(options[0].client):
                return await asyncio.to_thread(
                    admit, *edge, new_rid=self.new_rid, validate=self._validate
                )
        except ValueError as e:  # RequestError, or SamplingParams' own words
            raise from_value_error(e) from None

    @contextlib.asynccontextmanager
    async def _compile_share(self, client: str | None) -> AsyncIterator[None]:
        """One of client's compiles at the edge (tenants.CompileShares: a 429 past its share)."""
        self._compiles.take(client)
        try:
            yield
        finally:
            self._compiles.give_back(client)

    def _validate(self, kind: str, spec: Any) -> None:
        """The edge's validator, on a worker thread: stop regexes built by the compile worker
        (stop_regex_check.py), a constraint normalised and compiled in the grammar workers."""
        if kind == STOP_REGEX:
            self._stop_regex.check(spec)
        elif self._grammar is not None:
            self._grammar.for_kind(kind).validate(kind, spec)

    def _decode_vocabulary(self) -> list[str]:
        return self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])

    def token_text(self, token_id: int) -> str:
        """One token's text as decode([token_id]) gives it, from a table decoded once at start: a
        request's logprobs with text name up to MAX_LOGPROB_ITEMS tokens, each read on the event
        loop."""
        if 0 <= token_id < len(self._token_texts):
            return self._token_texts[token_id]
        return self.tokenizer.decode([token_id])

    def _make_grammar_backend(self) -> Any:
        """For the synchronous 400 check of a constraint (a bad one never reaches the scheduler)."""
        from radixrt.runtime.constrained.choose import backends_for

        info = self.scheduler.model_info
        vocab_size, eos = int(info["vocab_size"]), list(info["eos_token_ids"])
        # no index and no drafts: the edge only checks that a constraint compiles
        chooser = backends_for(
            self.config, self.tokenizer, vocab_size, eos, index=False, enable_jump_forward=False
        )
        # the configured backend now (outlines walks the vocabulary: ~0.5 s)
        chooser.for_kind("regex")
        return chooser

    @property
    def limits(self) -> EdgeLimits:
        return EdgeLimits(
            int(self.scheduler.model_info["vocab_size"]),
            self.context_len,
            self.pool_tokens,
            self.config.max_running_requests,
            int(self.scheduler.startup_server_info.get("page_size", 1)),
        )

    def check_num_sequences(self, rows_per_prompt: Iterable[int]) -> None:
        """Refuse a body that asks for more sequences (each prompt's n, or a beam search's width)
        than max_prompts_per_request, right after it is parsed: before any prompt is tokenized,
        checked or expanded (#56: 300,000 one-token prompts x n=16 grew this process by ~4 GB)."""
        limit = self.config.max_prompts_per_request
        total = 0
        for rows in rows_per_prompt:  # stops at the limit: linear in what is allowed, not sent
            total += rows
            if total > limit:
                break
        if total > limit:
            raise APIError(
                f"the request asks for more than {limit} sequences (prompts x n); at most "
                f"{limit} are allowed (max_prompts_per_request)",
                param="prompt",
            )

    def generate(self, reqs: list[TokenizedGenerateReq]) -> RequestHandle:
        """Send reqs (one body's, from admit); their client (options.client: http/tenants.py)
        is held to its share of the in-flight slots."""
        scheduler = self.scheduler
        client = reqs[0].options.client if reqs else None
        scheduler.check_alive()
        if len(reqs) > self.config.max_prompts_per_request:
            raise APIError(
                f"the request asks for {len(reqs)} sequences (prompts x n); at most "
                f"{self.config.max_prompts_per_request} are allowed (max_prompts_per_request)",
                param="prompt",
            )
        limit = self.config.max_running_requests + self.config.max_queued_requests
        states = scheduler.states
        if len(states) + len(reqs) > limit:
            raise APIError(
                f"too many requests in flight ({len(states)}); try again later",
                503,
                "server_overloaded",
            )
        # the running rows each may hold (each beam of a beam search one; #56.5: it counted one)
        rows = [rows_of(r.sampling_params) for r in reqs]
        if (
            client is not None
        ):  # then this client's share of them (serving/http/tenants.py), in rows
            held = sum(st.rows for st in states.values() if st.client == client)
            check_in_flight(held, sum(rows), self.config.requests_per_client)
        # encode all first: a request that cannot be sent (it never should, after the edge's bounds)
        # is refused whole and leaves nothing registered behind
        try:
            frames = [messages.encode(r) for r in reqs]
        except (TypeError, ValueError, OverflowError) as e:
            raise APIError(f"the request cannot be sent to the scheduler: {e}", 400) from None
        queue: asyncio.Queue = asyncio.Queue()
        for i, r in enumerate(reqs):
            states[r.rid] = ReqState(
                rid=r.rid,
                index=i,
                queue=queue,
                stream=r.options.stream,
                client=client,
                rows=rows[i],
            )
        scheduler.send_frames(frames)
        scheduler.metrics.inflight.set(len(states))
        return RequestHandle(scheduler, reqs, queue)

    async def cache_tree(
        self, max_depth: int, max_nodes: int, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The scheduler's cache view with text previews (decoded here, off the scheduler's step:
        the view crosses the socket as ids)."""
        view = await self.scheduler.cache_view(max_depth, max_nodes, timeout)
        if "error" in view:
            raise APIError(f"the cache view failed: {view['error']}", 500, "server_error")
        return add_previews(view, self.tokenizer)
