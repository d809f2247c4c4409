"""Backends: where a program's requests go. One small interface, two transports.

`Backend` holds what every transport shares (the SGLang /generate contract): generate,
stream, cache a prefix, score `select` choices, derive the chat template. A transport
supplies `_generate(**payload)` (Engine.generate's keywords), `_generate_stream`,
`tokenize`, and the chat template's source. `EngineBackend` wraps the in-process
Engine; `RuntimeEndpoint` (endpoint.py) speaks HTTP.

Optional, feature-detected: `pin_prefix(text, program_id) -> handle` / `unpin(handle)`
keep a prefix in the radix cache until released (fork holds one until join).
"""

from __future__ import annotations

import random
import threading
from typing import Any, Iterator

from radixrt.frontend import chat_template as ct
from radixrt.frontend.choices import BUILTIN_METHODS, ChoicesDecision, normalized_prompt_logprobs
from radixrt.runtime.core.token_prefix import common_prefix_len


class BackendError(RuntimeError):
    """The runtime refused or aborted a request (the message says why)."""


def _check(result: dict) -> dict:
    meta = result.get("meta_info", {})
    reason = meta.get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise BackendError(
            meta.get("error") or reason.get("message") or "request aborted by the runtime"
        )
    return result


def _prompt_logprobs(result: dict, ids: list[int], start: int) -> list[tuple]:
    """The (logprob, token_id, text) entries of ids[start:], checked against what was sent."""
    entries = [tuple(e) for e in _check(result)["meta_info"]["input_token_logprobs"]]
    if start == 0 and len(entries) == len(ids) - 1:
        entries.insert(0, (None, ids[0], None))  # a runtime may omit position 0 (it has no logprob)
    if [e[1] for e in entries] != ids[start:]:
        raise BackendError(
            f"the runtime's prompt logprobs cover other tokens than were sent "
            f"(got {len(entries)} entries for {len(ids) - start} tokens)"
        )
    return entries


class Backend:
    supports_pin = False
    # How many texts one select may score; keeps one request's logprob tensors bounded.
    max_select_choices = 256

    def __init__(self) -> None:
        self._chat_template: ct.ChatTemplate | None = None
        self._template_lock = threading.Lock()
        self._rng = random.Random(0)

    # ---- what a transport provides ------------------------------------------------------
    def _generate(self, **payload: Any) -> Any:
        raise NotImplementedError

    def _generate_stream(self, **payload: Any) -> Iterator[tuple[str, dict]]:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids exactly as the runtime tokenizes a text prompt; None if unknown."""
        return None

    def _template_source(self) -> tuple[str | None, str, str]:
        return None, "", ""

    def get_model_info(self) -> dict:
        return {}

    # ---- shared -------------------------------------------------------------------------
    def get_chat_template(self) -> ct.ChatTemplate:
        with self._template_lock:
            if self._chat_template is None:
                template, bos, eos = self._template_source()
                self._chat_template = ct.from_tokenizer_config(template, bos, eos)
            return self._chat_template

    def set_chat_template(self, template: ct.ChatTemplate) -> None:
        self._chat_template = template

    def generate(
        self,
        text: str,
        sampling_params: dict,
        program_id: str | None = None,
        session_id: str | None = None,
        **logprob_options: Any,
    ) -> tuple[str | list[str], dict | list[dict]]:
        """(text, meta_info); with sampling_params n > 1, a list of each, one per sample.
        session_id: the runtime keeps this turn pinned until the session's next one
        (Engine.generate)."""
        result = self._generate(
            prompt=text,
            sampling_params=sampling_params,
            program_id=program_id,
            **({"session_id": session_id} if session_id is not None else {}),
            **logprob_options,
        )
        if isinstance(result, list):  # n > 1: the runtime answers one result per sample
            results = [_check(r) for r in result]
            return [r["text"] for r in results], [r["meta_info"] for r in results]
        result = _check(result)
        return result["text"], result["meta_info"]

    def generate_stream(
        self,
        text: str,
        sampling_params: dict,
        program_id: str | None = None,
        session_id: str | None = None,
        **logprob_options: Any,
    ) -> Iterator[tuple[str, dict]]:
        session = {"session_id": session_id} if session_id is not None else {}
        for delta, meta in self._generate_stream(
            prompt=text,
            sampling_params=sampling_params,
            program_id=program_id,
            **session,
            **logprob_options,
        ):
            _check({"meta_info": meta})
            yield delta, meta

    def cache_prefix(self, text: str, program_id: str | None = None) -> dict:
        """Prefill `text` into the radix cache (a max_new_tokens=0 request)."""
        result = _check(
            self._generate(
                prompt=text, sampling_params={"max_new_tokens": 0}, program_id=program_id
            )
        )
        return result["meta_info"]

    def select(
        self,
        prefix: str,
        choices: list[str],
        temperature: float,
        choices_method: Any,
        program_id: str | None = None,
    ) -> ChoicesDecision:
        if len(choices) > self.max_select_choices:
            raise ValueError(
                f"select has {len(choices)} choices; at most {self.max_select_choices} are scored"
            )
        scored = self.score_choices(
            prefix,
            choices,
            choices_method.requires_unconditional_logprobs
            if hasattr(choices_method, "requires_unconditional_logprobs")
            else False,
            program_id,
        )
        cond, uncond = scored
        kwargs = dict(
            choices=choices,
            normalized_prompt_logprobs=normalized_prompt_logprobs(cond),
            input_token_logprobs=cond,
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=uncond,
        )
        if isinstance(choices_method, BUILTIN_METHODS):
            kwargs.update(temperature=temperature, rng=self._rng)
        return choices_method(**kwargs)

    def score_choices(
        self,
        prefix: str,
        choices: list[str],
        unconditional: bool = False,
        program_id: str | None = None,
    ) -> tuple[list[list], list[list] | None]:
        """Per choice, the (logprob, token_id, text) entries of the choice's own tokens given
        `prefix`; with `unconditional`, also the same tokens' logprobs without the prefix.

        The prefix is cached first (one max_new_tokens=0 request); then all choices are
        scored in ONE batched request whose prompts share it. Where tokenization merges the
        prefix's tail with a choice (e.g. "A: " + "yes" -> "A:", " yes"), the choice's
        tokens start at the first token that differs from the prefix's own tokens.
        """
        prefix_ids = self.tokenize(prefix)
        if prefix_ids is None:
            return self._score_choices_text(prefix, choices, unconditional, program_id)
        full_ids = [self.tokenize(prefix + c) for c in choices]
        starts = [min(common_prefix_len(prefix_ids, f), len(f) - 1) for f in full_ids]
        shared = min(starts)
        if shared > 0:
            self._cache_ids(prefix_ids[:shared], program_id)
        results = self._generate(
            input_ids=full_ids,
            sampling_params={"max_new_tokens": 0, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=shared,
            program_id=program_id,
        )
        cond = [
            _prompt_logprobs(result, ids, shared)[start - shared :]
            for ids, start, result in zip(full_ids, starts, results)
        ]
        uncond = None
        if unconditional:
            own_ids = [ids[start:] for ids, start in zip(full_ids, starts)]
            results = self._generate(
                input_ids=own_ids,
                sampling_params={"max_new_tokens": 0, "temperature": 0.0},
                return_logprob=True,
                logprob_start_len=0,
                program_id=program_id,
            )
            uncond = [_prompt_logprobs(r, ids, 0) for ids, r in zip(own_ids, results)]
        return cond, uncond

    def _cache_ids(self, ids: list[int], program_id: str | None) -> None:
        _check(
            self._generate(
                input_ids=ids, sampling_params={"max_new_tokens": 0}, program_id=program_id
            )
        )

    def _score_choices_text(
        self, prefix: str, choices: list[str], unconditional: bool, program_id: str | None
    ) -> tuple[list[list], list[list] | None]:
        """Without a tokenizer: assume the prefix's tokens are a prefix of prefix+choice's
        (true unless the boundary merges), and score from there."""
        shared = self.cache_prefix(prefix, program_id)["prompt_tokens"] if prefix else 0
        results = self._generate(
            prompt=[prefix + c for c in choices],
            sampling_params={"max_new_tokens": 0, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=shared,
            program_id=program_id,
        )
        cond = [[tuple(e) for e in _check(r)["meta_info"]["input_token_logprobs"]] for r in results]
        uncond = None
        if unconditional:
            own_ids = [[e[1] for e in c] for c in cond]
            results = self._generate(
                input_ids=own_ids,
                sampling_params={"max_new_tokens": 0, "temperature": 0.0},
                return_logprob=True,
                logprob_start_len=0,
                program_id=program_id,
            )
            uncond = [_prompt_logprobs(r, ids, 0) for ids, r in zip(own_ids, results)]
        return cond, uncond

    def flush_cache(self) -> bool:
        raise NotImplementedError

    def get_server_info(self) -> dict:
        raise NotImplementedError


class EngineBackend(Backend):
    """The in-process Engine as a backend: no HTTP, the same scheduler."""

    def __init__(self, engine: Any = None, **engine_kwargs: Any):
        super().__init__()
        if engine is None:
            from radixrt.runtime.engine.engine import Engine  # imports torch: only when asked for

            engine = Engine(**engine_kwargs)
        elif engine_kwargs:
            raise ValueError("give an engine or Engine arguments, not both")
        self.engine = engine
        self.supports_pin = callable(getattr(engine, "pin_prefix", None))

    def _generate(self, **payload: Any) -> Any:
        return self.engine.generate(**payload)

    def _generate_stream(self, **payload: Any) -> Iterator[tuple[str, dict]]:
        # Engine's stream chunks carry the new text only.
        for chunk in self.engine.generate(stream=True, **payload):
            yield chunk["text"], chunk["meta_info"]

    def tokenize(self, text: str) -> list[int]:
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def _template_source(self) -> tuple[str | None, str, str]:
        tok = self.engine.tokenizer
        # The Engine encodes prompts without special tokens, so a template's {{ bos_token }}
        # must stay in the text.
        return getattr(tok, "chat_template", None), tok.bos_token or "", tok.eos_token or ""

    def get_model_info(self) -> dict:
        return getattr(self.engine.scheduler, "model_info", {})

    def pin_prefix(self, text: str, program_id: str | None = None) -> Any:
        return self.engine.pin_prefix(text, program_id=program_id)

    def unpin(self, handle: Any) -> None:
        self.engine.unpin(handle)

    def close_session(self, session_id: str) -> None:
        self.engine.close_session(session_id)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        self.engine.shutdown()
