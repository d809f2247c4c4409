"""A deterministic fake runtime for the DSL's unit tests.

It implements the transport half of `Backend` (what Engine.generate / POST /generate
do), so the shared half (select scoring, prefix caching, chat template) runs for real:

- tokens are words with their leading space (" yes"), punctuation and lone spaces, so
  "A: " + "yes" merges at the boundary the way BPE does;
- a toy radix cache (a set of token prefixes) reports `cached_tokens` like the runtime;
- `respond(prompt, sampling)` scripts the generated text (default: the rule table);
- `token_logprob(token_text)` scripts the prompt logprobs used by select.
Every request is recorded in `self.log` (a dict per prompt) in arrival order.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, Iterator

from radixrt.frontend.backends import Backend

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TOKEN = re.compile(r"<\|[a-z_]+\|>| ?\w+| |\n|[^\w\s]")


class FakeBackend(Backend):
    def __init__(
        self,
        rules: list[tuple[str, str]] | None = None,
        respond: Callable | None = None,
        logprobs: dict[str, float] | None = None,
        delay: float = 0.0,
        supports_pin: bool = True,
        template: str | None = SMOLLM_TEMPLATE,
        stream_delay: float = 0.0,
    ):
        super().__init__()
        self.rules = rules or []
        self.respond_fn = respond
        self.logprobs = logprobs or {}
        self.delay = delay
        self.stream_delay = stream_delay
        self.supports_pin = supports_pin
        self.template = template
        self.vocab: dict[str, int] = {}
        self.lock = threading.Lock()
        self.cache: set[tuple[int, ...]] = set()
        self.log: list[dict[str, Any]] = []
        self.pins: dict[str, str] = {}
        self.pin_log: list[tuple[str, str]] = []
        self.num_pins = 0

    # ---- toy tokenizer and model ---------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        with self.lock:
            return [self.vocab.setdefault(t, len(self.vocab) + 10) for t in _TOKEN.findall(text)]

    def token_text(self, token_id: int) -> str:
        return next(t for t, i in self.vocab.items() if i == token_id)

    def token_logprob(self, text: str) -> float:
        return self.logprobs.get(text, -10.0)

    def respond(self, prompt: str, sampling: dict) -> str:
        if self.respond_fn is not None:
            return self.respond_fn(prompt, sampling)
        for needle, out in self.rules:
            if needle in prompt[-200:]:
                return out
        return " default"

    # ---- the transport interface ---------------------------------------------------------
    def _template_source(self) -> tuple[str | None, str, str]:
        return self.template, "", "<|im_end|>"

    def _one(
        self,
        prompt: str | None,
        ids: list[int] | None,
        sampling: dict,
        return_logprob: bool,
        logprob_start_len: int | None,
        program_id: str | None,
    ) -> dict:
        if sampling.get("temperature", 0) < 0:
            raise ValueError(
                f"sampling parameter temperature must be in [0, 100], got {sampling['temperature']}"
            )
        if ids is None:
            ids = self.tokenize(prompt)
        text_prompt = prompt if prompt is not None else "".join(self.token_text(i) for i in ids)
        with self.lock:
            cached = max(
                (n for n in range(len(ids) + 1) if tuple(ids[:n]) in self.cache), default=0
            )
        max_new = sampling.get("max_new_tokens", 128)
        out = "" if max_new == 0 else self.respond(text_prompt, sampling)
        reason: dict = {"type": "length", "length": max_new}
        for stop in sampling.get("stop", []) or []:
            cut = out.find(stop)
            if cut >= 0:
                out, reason = out[:cut], {"type": "stop", "matched": stop}
        out_tokens = _TOKEN.findall(out)[:max_new] if max_new else []
        out = "".join(out_tokens)
        if reason["type"] == "length" and len(out_tokens) < max_new:
            reason = {"type": "stop", "matched": 2}
        out_ids = self.tokenize(out)
        with self.lock:
            full = ids + out_ids
            for n in range(1, len(full) + 1):
                self.cache.add(tuple(full[:n]))
            self.log.append(
                {
                    "prompt": text_prompt,
                    "input_ids": list(ids),
                    "sampling": dict(sampling),
                    "program_id": program_id,
                    "cached_tokens": cached,
                    "output": out,
                    "return_logprob": return_logprob,
                    "logprob_start_len": logprob_start_len,
                    "thread": threading.get_ident(),
                    "time": time.time(),
                }
            )
        meta = {
            "id": str(len(self.log)),
            "prompt_tokens": len(ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": cached,
            "finish_reason": reason,
        }
        if return_logprob:
            start = logprob_start_len or 0
            meta["input_token_logprobs"] = [
                (None if i == 0 else self.token_logprob(self.token_text(ids[i])), ids[i], None)
                for i in range(start, len(ids))
            ]
            meta["output_token_logprobs"] = []
        return {"text": out, "output_ids": out_ids, "meta_info": meta}

    def _generate(
        self,
        prompt: Any = None,
        input_ids: Any = None,
        sampling_params: Any = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        program_id: str | None = None,
        stream: bool = False,
    ) -> Any:
        if self.delay:
            time.sleep(self.delay)
        single = isinstance(prompt, str) or (
            input_ids is not None and input_ids and isinstance(input_ids[0], int)
        )
        prompts = [prompt] if isinstance(prompt, str) else prompt
        id_lists = [input_ids] if single and input_ids is not None else input_ids
        n = len(prompts) if prompts is not None else len(id_lists)
        params = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * n
        )
        outs = [
            self._one(
                prompts[i] if prompts else None,
                id_lists[i] if id_lists else None,
                params[i],
                return_logprob,
                logprob_start_len,
                program_id,
            )
            for i in range(n)
        ]
        return outs[0] if single else outs

    def _generate_stream(self, **payload: Any) -> Iterator[tuple[str, dict]]:
        result = self._generate(**payload)
        pieces = _TOKEN.findall(result["text"]) or [""]
        for i, piece in enumerate(pieces):
            if self.stream_delay:
                time.sleep(self.stream_delay)
            meta = dict(result["meta_info"], completion_tokens=i + 1)
            yield piece, meta

    def pin_prefix(self, text: str, program_id: str | None = None) -> str:
        self.cache_prefix(text, program_id)
        with self.lock:
            self.num_pins += 1
            handle = f"pin-{self.num_pins}"
            self.pins[handle] = text
            self.pin_log.append(("pin", handle))
        return handle

    def unpin(self, handle: str) -> None:
        with self.lock:
            del self.pins[handle]
            self.pin_log.append(("unpin", handle))

    def flush_cache(self) -> bool:
        with self.lock:
            self.cache.clear()
        return True

    def get_server_info(self) -> dict:
        return {"num_requests": len(self.log)}
