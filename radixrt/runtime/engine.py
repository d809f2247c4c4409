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

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.sampling_params import SamplingParams

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(ServerConfig)}


class _Collected:
    """Everything the scheduler sent back for one request, accumulated."""

    def __init__(self) -> None:
        self.output_ids: list[int] = []
        self.last: TokenOut | None = None
        self.output_logprobs: list = []
        self.output_top_logprobs: list = []
        self.input_logprobs = None
        self.input_top_logprobs = None

    def add(self, out: TokenOut) -> None:
        self.output_ids.extend(out.new_ids)
        self.output_logprobs.extend(out.output_logprobs)
        self.output_top_logprobs.extend(out.output_top_logprobs)
        if out.input_logprobs is not None:
            self.input_logprobs, self.input_top_logprobs = out.input_logprobs, out.input_top_logprobs
        self.last = out

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last.finished_reason is not None


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any):
        unknown = sorted(set(kwargs) - _CONFIG_FIELDS)
        if unknown:
            raise ValueError(f"unknown Engine argument(s): {', '.join(unknown)}")
        from radixrt.runtime.scheduler import Scheduler  # torch is imported only here

        self.config = ServerConfig(model_path=model_path, **kwargs)
        self.scheduler = Scheduler(self.config)
        self.tokenizer = self.scheduler.tokenizer
        self._lock = threading.Lock()
        self._collected: dict[str, _Collected] = {}
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    # ---------------------------------------------------------------- public API
    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None, return_logprob: bool = False,
                 logprob_start_len: int | None = None, top_logprobs_num: int = 0, stream: bool = False,
                 program_id: str | None = None) -> dict | list[dict] | Iterator[dict]:
        single, ids_list = self._tokenize(prompt, input_ids)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(ids_list)
        if len(params) != len(ids_list):
            raise ValueError(f"got {len(params)} sampling_params for {len(ids_list)} prompts")
        parsed = [SamplingParams.from_dict(p) for p in params]
        for sp in parsed:
            self._validate_constraint(sp)
        start = -1 if not return_logprob else (logprob_start_len if logprob_start_len is not None else -1)
        msgs: list[list[TokenizedGenerateReq]] = []
        for ids, sp in zip(ids_list, parsed):
            copies = []
            for i in range(sp.n):
                d = dataclasses.replace(sp, n=1, seed=None if sp.seed is None else sp.seed + i).to_dict()
                copies.append(TokenizedGenerateReq(
                    rid=f"{self._prefix}-{next(self._ids)}", input_ids=list(ids), sampling_params=d,
                    return_logprob=return_logprob, logprob_start_len=start, top_logprobs_num=top_logprobs_num,
                    stream=stream, program_id=program_id, arrival_time=time.time()))
            msgs.append(copies)
        flat = [m for copies in msgs for m in copies]
        if stream:
            if len(flat) != 1:
                raise ValueError("stream=True takes one prompt with n=1")
            return self._stream(flat[0])
        self._run(flat)
        results = [[self._result(m) for m in copies] for copies in msgs]
        out = [r[0] if len(r) == 1 else r for r in results]
        return out[0] if single else out

    def pin_prefix(self, prompt: str | None = None, input_ids: list[int] | None = None,
                   program_id: str | None = None, ttl_s: float = 600.0) -> str | None:
        """Compute the prompt's KV and keep it pinned in the radix cache until `unpin(handle)`
        (or ttl_s passes). Returns the handle, or None when the runtime refused the pin."""
        _, ids_list = self._tokenize(prompt, input_ids)
        if not (isinstance(ttl_s, (int, float)) and ttl_s > 0):
            raise ValueError(f"ttl_s must be a positive number, got {ttl_s!r}")
        msg = TokenizedGenerateReq(rid=f"{self._prefix}-pin-{next(self._ids)}", input_ids=list(ids_list[0]),
                                   sampling_params={"max_new_tokens": 0}, program_id=program_id,
                                   arrival_time=time.time(), pin_ttl_s=float(ttl_s))
        self._run([msg])
        reason = self._result(msg)["meta_info"]["finish_reason"] or {}
        return msg.rid if reason.get("pinned") else None

    def unpin(self, handle: str) -> bool:
        with self._lock:
            return self.scheduler.unpin(handle)

    def flush_cache(self) -> bool:
        with self._lock:
            return self.scheduler.flush_cache()

    def get_server_info(self) -> dict:
        with self._lock:
            return {**dataclasses.asdict(self.config), **self.scheduler.server_info()}

    def check_integrity(self) -> None:
        with self._lock:
            self.scheduler.check_integrity()

    def shutdown(self) -> None:
        with self._lock:
            for rid in list(self._collected):
                self.scheduler.abort(rid)
            self._collected.clear()
            if self.scheduler.grammar_backend is not None:
                self.scheduler.grammar_backend.shutdown()

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

    def _validate_constraint(self, sp: SamplingParams) -> None:
        for kind in ("regex", "json_schema", "choices"):
            spec = getattr(sp, kind)
            if spec is not None:
                with self._lock:
                    self.scheduler._grammar().validate(kind, spec)

    def _submit(self, msgs: list[TokenizedGenerateReq]) -> None:
        with self._lock:
            for m in msgs:
                self._collected[m.rid] = _Collected()
            for m in msgs:
                self._dispatch(self.scheduler.add_request(m))

    def _dispatch(self, outs: list[TokenOut]) -> None:
        for out in outs:
            c = self._collected.get(out.rid)
            if c is not None:
                c.add(out)

    def _step_until(self, done) -> None:
        while True:
            with self._lock:
                if done():
                    return
                before = self.scheduler.stats.num_forwards
                self._dispatch(self.scheduler.step())
                ran = self.scheduler.stats.num_forwards != before
            if not ran:
                time.sleep(0.001)  # only grammar compilations (or other threads' work) pending

    def _run(self, msgs: list[TokenizedGenerateReq]) -> None:
        self._submit(msgs)
        states = [self._collected[m.rid] for m in msgs]
        self._step_until(lambda: all(s.finished for s in states))

    def _stream(self, msg: TokenizedGenerateReq) -> Iterator[dict]:
        self._submit([msg])
        state = self._collected[msg.rid]
        sent_text, sent_ids = "", 0
        try:
            while True:
                self._step_until(lambda: state.finished or len(state.output_ids) > sent_ids)
                full = self._result(msg, pop=False)
                text = full["text"]
                if not state.finished:
                    text = text.rstrip("\ufffd")  # an unfinished multi-byte character: wait for the rest
                    text = text[:len(text) - self._stop_holdback(text, msg)]
                delta_ids = state.output_ids[sent_ids:]
                sent_ids = len(state.output_ids)
                if len(text) > len(sent_text) or state.finished:
                    yield {**full, "text": text[len(sent_text):], "output_ids": delta_ids}
                    sent_text = text
                if state.finished:
                    return
        finally:
            with self._lock:
                if not state.finished:
                    self._dispatch(self.scheduler.abort(msg.rid))
                self._collected.pop(msg.rid, None)

    @staticmethod
    def _stop_holdback(text: str, msg: TokenizedGenerateReq) -> int:
        """Characters at the end that could begin a stop string: not shown until decided."""
        hold = 0
        for s in msg.sampling_params.get("stop") or []:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        return hold

    def _result(self, msg: TokenizedGenerateReq, pop: bool = True) -> dict:
        with self._lock:
            state = self._collected.pop(msg.rid) if pop else self._collected[msg.rid]
        last = state.last
        skip = msg.sampling_params.get("skip_special_tokens", True)
        text = self.tokenizer.decode(state.output_ids, skip_special_tokens=skip)
        reason = last.finished_reason if last else None
        if reason and reason.get("type") == "stop" and isinstance(reason.get("matched"), str):
            cut = text.find(reason["matched"])
            text = text[:cut] if cut >= 0 else text
        meta: dict[str, Any] = {
            "id": msg.rid, "prompt_tokens": len(msg.input_ids), "completion_tokens": len(state.output_ids),
            "cached_tokens": last.cached_tokens if last else 0, "finish_reason": reason,
        }
        if last is not None and last.error:
            meta["error"] = last.error
        if msg.return_logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in state.output_logprobs]
            meta["output_top_logprobs"] = [[(lp, t, None) for lp, t in top] for top in state.output_top_logprobs]
            meta["input_token_logprobs"] = [(lp, t, None) for lp, t in state.input_logprobs or []]
            meta["input_top_logprobs"] = [[(lp, t, None) for lp, t in top] for top in state.input_top_logprobs or []]
        return {"text": text, "output_ids": list(state.output_ids), "meta_info": meta}
