"""In-process Engine: SGLang's offline API over the very same Scheduler, no HTTP.

Thread-safe: callers on many threads add requests under one lock, and whichever caller
holds the lock runs the next scheduler step, so everybody's requests share each batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid
from typing import Any, Iterator

from radixrt.runtime.cache_tree_text import add_previews, check_view_limits
from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.cache_view import DEFAULT_MAX_DEPTH, DEFAULT_MAX_NODES
from radixrt.runtime.core.pins import MAX_PIN_TTL_S
from radixrt.runtime.engine.sequence import Sequence
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.edge import STOP_REGEX, admit, per_prompt
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.stop_regex_check import StopRegexChecker

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(ServerConfig)}


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any):
        unknown = sorted(set(kwargs) - _CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown Engine argument(s): {', '.join(unknown)}")
        from radixrt.runtime.engine.scheduler_factory import (
            create_scheduler,  # torch is imported only here
        )

        self.config = ServerConfig(model_path=model_path, **kwargs)
        if self.config.disaggregation_mode != "null" or self.config.pd is not None:
            raise ValueError(
                "prefill-decode disaggregation is served by `radixrt serve --disaggregation-mode` "
                "(or --pd 1p1d) behind sglang-router, not by the in-process Engine"
            )
        self.scheduler = create_scheduler(self.config)
        self.tokenizer = self.scheduler.tokenizer
        self._lock = threading.Lock()
        self._sequences: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._stop_regex = StopRegexChecker(self.config.grammar_compile_memory_mb)

    # ---------------------------------------------------------------- public API
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        stream: bool = False,
        program_id: str | None = None,
        session_id: str | None = None,
        return_text_in_logprobs: bool = False,
        lora_path: str | list[str | None] | None = None,
        cache_salt: str | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """session_id: this is a turn of that conversation; when it finishes its text stays pinned
        in the cache until the session's next turn, close_session, or the session ttl
        (core/sessions.py). lora_path: the LoRA adapter (by name) the prompts run with, or one per
        prompt (None: the base model). cache_salt (vLLM's): KV is shared only with requests of the
        same salt (core/namespaces.py)."""
        single, ids_list = self._tokenize(prompt, input_ids)
        num = len(ids_list)
        options = [  # one per prompt: the prompts differ only in their LoRA adapter
            RequestOptions(
                stream=stream,
                return_logprob=return_logprob,
                logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
                top_logprobs_num=top_logprobs_num,
                program_id=program_id,
                session_id=session_id,
                lora=lora,
                cache_salt=cache_salt,
            )
            for lora in per_prompt(lora_path, num, "lora_path")
        ]
        msgs = self._admit(ids_list, per_prompt(sampling_params, num, "sampling_params"), options)
        flat = [m for copies in msgs for m in copies]
        if stream:
            if len(flat) != 1:
                raise ValueError("stream=True takes one prompt with n=1")
            return self._stream(flat[0], return_text_in_logprobs)
        seqs = self._run(flat)
        for seq in seqs.values():
            seq.text_in_logprobs = return_text_in_logprobs
        results = [[o for m in copies for o in seqs[m.rid].outputs()] for copies in msgs]
        out = [r[0] if len(r) == 1 else r for r in results]
        return out[0] if single else out

    def beam_search(
        self,
        prompts: str | list[str] | None = None,
        beam_width: int = 4,
        max_new_tokens: int = 16,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        num_return: int | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict | None = None,
    ) -> list[dict] | list[list[dict]]:
        """Beam search (vLLM's LLM.beam_search; transformers' num_beams): for each prompt its
        num_return (default beam_width) best beams, best first; each a /generate result whose
        meta_info holds cumulative_logprob and beam_score (sum of logprobs / length **
        length_penalty). sampling_params: more of them (a constraint, min_new_tokens, ...)."""
        params = {
            **(sampling_params or {}),
            "beam_width": beam_width,
            "n": beam_width if num_return is None else num_return,
            "max_new_tokens": max_new_tokens,
            "length_penalty": length_penalty,
            "early_stopping": early_stopping,
        }
        single, ids_list = self._tokenize(prompts, input_ids)
        out = self.generate(input_ids=ids_list, sampling_params=params)
        beams = [[r] if isinstance(r, dict) else r for r in out]  # a dict: one beam returned
        return beams[0] if single else beams

    def _admit(
        self, prompts: list[list[int]], params: list[Any], options: list[RequestOptions]
    ) -> list[list[TokenizedGenerateReq]]:
        """The request edge (request/edge.admit), as the server runs it: each prompt's requests."""
        with self._lock:
            rules = self.scheduler.edge_rules
        return admit(
            prompts, params, options, rules, new_rid=self._new_rid, validate=self._validate
        )

    def pin_prefix(
        self,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        program_id: str | None = None,
        ttl_s: float = 600.0,
        cache_salt: str | None = None,
    ) -> str | None:
        """Compute the prompt's KV and keep it pinned in the radix cache until `unpin(handle)`
        (or ttl_s passes). Returns the handle, or None when the runtime refused the pin."""
        _, ids_list = self._tokenize(prompt, input_ids)
        if not (isinstance(ttl_s, (int, float)) and 0 < ttl_s <= MAX_PIN_TTL_S):
            raise ValueError(f"ttl_s must be a number in (0, {MAX_PIN_TTL_S:g}], got {ttl_s!r}")
        options = RequestOptions(
            program_id=program_id, pin_ttl_s=float(ttl_s), cache_salt=cache_salt
        )
        msg = self._admit(ids_list[:1], [{"max_new_tokens": 0}], [options])[0][0]
        reason = self._run([msg])[msg.rid].result.finished_reason or {}
        return reason.get("pin_handle")

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """Serve the PEFT adapter at lora_path as lora_name (ValueError: why it cannot be)."""
        with self._lock:
            self.scheduler.admin.load_lora(lora_name, lora_path)

    def unload_lora_adapter(self, lora_name: str) -> None:
        with self._lock:
            self.scheduler.admin.unload_lora(lora_name)

    def unpin(self, handle: str) -> bool:
        with self._lock:
            return self.scheduler.admin.unpin(handle)

    def close_session(self, session_id: str, cache_salt: str | None = None) -> bool:
        """End a session (of cache_salt's): its pinned turn may be evicted again. False when there
        is no such session."""
        with self._lock:
            return self.scheduler.admin.close_session(session_id, cache_salt)

    def flush_cache(self) -> bool:
        with self._lock:
            return self.scheduler.admin.flush_cache()

    def get_server_info(self) -> dict:
        with self._lock:
            return {**dataclasses.asdict(self.config), **self.scheduler.admin.server_info()}

    def get_cache_tree(
        self, max_depth: int = DEFAULT_MAX_DEPTH, max_nodes: int = DEFAULT_MAX_NODES
    ) -> dict:
        """What the radix tree holds, as `GET /cache_tree` returns it (text previews included)."""
        check_view_limits(max_depth, max_nodes)
        with self._lock:
            view = self.scheduler.admin.cache_tree(max_depth, max_nodes)
        return add_previews(view, self.tokenizer)

    def check_integrity(self) -> None:
        with self._lock:
            self.scheduler.check_integrity()

    def shutdown(self) -> None:
        with self._lock:
            for rid in list(self._sequences):
                self.scheduler.abort(rid)
            self._sequences.clear()
            self.scheduler.close()
        self._stop_regex.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- internals
    def _tokenize(self, prompt, input_ids) -> tuple[bool, list[list[int]]]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt and input_ids")
        if prompt is not None:
            if isinstance(prompt, str):
                return True, [self.tokenizer.encode(prompt, add_special_tokens=False)]
            if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
                raise ValueError("prompt must be a string or a list of strings")
            return False, [self.tokenizer.encode(p, add_special_tokens=False) for p in prompt]
        if isinstance(input_ids, list) and all(isinstance(t, int) for t in input_ids):
            return True, [input_ids]
        if isinstance(input_ids, list) and all(isinstance(x, list) for x in input_ids):
            return False, input_ids
        raise ValueError("input_ids must be a list of ints or a list of lists of ints")

    def _new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def _validate(self, kind: str, spec: Any) -> None:
        """The edge's validator: stop regexes built in a worker (stop_regex_check.py), a
        constraint compiled by its grammar backend (thread-safe; outside the lock so other
        callers' steps go on)."""
        if kind == STOP_REGEX:
            self._stop_regex.check(spec)
            return
        with self._lock:
            grammar = self.scheduler.grammar_backend(kind)
        grammar.validate(kind, spec)

    def _submit(self, msgs: list[TokenizedGenerateReq]) -> dict[str, Sequence]:
        seqs = {m.rid: Sequence(m, self.tokenizer) for m in msgs}
        with self._lock:
            self._sequences.update(seqs)
            for m in msgs:
                self.scheduler.add_request(m)
            self._dispatch(self.scheduler.take_outputs())
        return seqs

    def _dispatch(self, outs: list[TokenOut]) -> None:
        for out in outs:
            seq = self._sequences.get(out.rid)
            if seq is not None:
                seq.add(out)
                if seq.finished:
                    del self._sequences[out.rid]

    def _step_until(self, done) -> None:
        while True:
            with self._lock:
                if done():
                    return
                ran = self.scheduler.step()
                self._dispatch(self.scheduler.take_outputs())
            if not ran:
                time.sleep(0.001)  # only grammar compilations (or other threads' work) pending

    def _run(self, msgs: list[TokenizedGenerateReq]) -> dict[str, Sequence]:
        seqs = self._submit(msgs)
        self._step_until(lambda: all(s.finished for s in seqs.values()))
        return seqs

    def _stream(self, msg: TokenizedGenerateReq, text_in_logprobs: bool = False) -> Iterator[dict]:
        seq = self._submit([msg])[msg.rid]
        seq.text_in_logprobs = text_in_logprobs
        res = seq.result
        interval = msg.sampling_params.get("stream_interval") or 1
        sent_ids = sent_logprobs = 0
        try:
            while True:
                seen = len(res.output_ids)
                self._step_until(
                    lambda seen=seen, sent=sent_ids: (
                        seq.finished or len(res.output_ids) >= max(seen + 1, sent + interval)
                    )
                )
                text = res.text[len(seq.shown) :]
                if text or seq.finished:
                    delta_ids = res.output_ids[sent_ids:]
                    seq.shown = res.text
                    yield {**seq.output(sent_logprobs), "text": text, "output_ids": delta_ids}
                    sent_ids, sent_logprobs = len(res.output_ids), len(res.output_logprobs)
                if seq.finished:
                    return
        finally:
            with self._lock:
                if not seq.finished:
                    self.scheduler.abort(msg.rid)
                    self._dispatch(self.scheduler.take_outputs())
                self._sequences.pop(msg.rid, None)
