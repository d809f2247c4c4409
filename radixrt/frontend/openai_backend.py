"""sgl.OpenAI: run programs against any OpenAI-compatible server (hosted, vLLM, SGLang, radixrt)
through the `openai` client.

Two modes. Completion (`is_chat_model=False`, the default with a `base_url`): the program's text,
role markers included, is the prompt of /v1/completions, so a program produces exactly the text it
would on the Engine. Chat (`is_chat_model=True`, the default for OpenAI's own models): each gen
sends the finished messages to /v1/chat/completions; the gen must then open the assistant's turn
(`s += sgl.assistant(sgl.gen(...))`), as in SGLang's OpenAI backend.

`select` in completion mode ranks the choices by their prompt logprobs, as on the Engine: one
/v1/completions request with each prefix + choice as a prompt, `echo=True, logprobs=0, max_tokens=0`
(the legacy OpenAI way; vLLM answers it); a choice's tokens are those ending past the prefix (text
offsets counted from the end: a token merged across the boundary is the choice's). Where the server
refuses that (a 400: radixrt's own server, OpenAI's hosted models) and in chat mode it is
approximate: a greedy generation of one of the choices under a regex constraint (a server ignoring
`regex` generates freely and the choice the text starts with, or else the nearest, is taken);
meta_info says which ran. Constraints: regex (and gen dtype) go as the `regex` extra field (radixrt,
SGLang); json_schema as `response_format` (vLLM's structured outputs take it too).
Logprobs, pins and cache administration are not available here and raise NotImplementedError naming
them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import requests

from radixrt.frontend import chat_template as ct
from radixrt.frontend.backends import Backend
from radixrt.frontend.choices import BUILTIN_METHODS, ChoicesDecision

# completion models among OpenAI's own (the rest of its models are chat models)
COMPLETION_MODELS = ("gpt-3.5-turbo-instruct", "babbage-002", "davinci-002")
MAX_CHOICE_TOKENS = 256
_NEUTRAL = {
    "stop_token_ids": [],
    "top_k": -1,
    "min_p": 0.0,
    "ignore_eos": False,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}  # SGLang sampling defaults that need not be sent


class OpenAI(Backend):
    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        chat_template: ct.ChatTemplate | None = None,
        **client_kwargs: Any,
    ):
        super().__init__()
        try:
            import openai
        except ImportError:
            raise ImportError("sgl.OpenAI needs the openai package: pip install openai") from None
        self.model_name = model_name
        self.base_url = base_url
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY", "none"),
            **client_kwargs,
        )
        self.is_chat_model = (
            (base_url is None and model_name not in COMPLETION_MODELS)
            if is_chat_model is None
            else is_chat_model
        )
        self.wants_messages = self.is_chat_model  # the interpreter passes the finished messages
        self._echo_logprobs: bool | None = None  # does the server echo prompt logprobs? (select)
        if chat_template is not None:
            self.set_chat_template(chat_template)

    # ---- the chat template: the server's own when it publishes it (radixrt, SGLang), else ChatML
    def _template_source(self) -> tuple[str | None, str, str]:
        if self.base_url is not None:
            root = re.sub(r"/v1/?$", "", self.base_url.rstrip("/"))
            try:
                info = requests.get(root + "/get_model_info", timeout=30).json()
                if isinstance(info, dict) and info.get("chat_template"):
                    return (
                        info["chat_template"],
                        info.get("bos_token") or "",
                        info.get("eos_token") or "",
                    )
            except (requests.RequestException, ValueError):
                pass
        return None, "", ""

    # ---- requests
    @staticmethod
    def _request(sampling_params: dict) -> tuple[dict[str, Any], dict[str, Any]]:
        """SGLang sampling params -> (OpenAI arguments, extra_body)."""
        sp = dict(sampling_params)
        args: dict[str, Any] = {}
        for ours, theirs in (
            ("max_new_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("frequency_penalty", "frequency_penalty"),
            ("presence_penalty", "presence_penalty"),
            ("seed", "seed"),
            ("n", "n"),
            ("stop", "stop"),
        ):
            if sp.get(ours) is not None:
                args[theirs] = sp.pop(ours)
        if sp.get("json_schema") is not None:
            args["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": json.loads(sp.pop("json_schema"))},
            }
        # regex, top_k, min_p, min_tokens, ignore_eos, ...: only when set to something other than
        # their defaults (a hosted API refuses arguments it does not know)
        extra = {k: v for k, v in sp.items() if v is not None and _NEUTRAL.get(k, object()) != v}
        if "min_new_tokens" in extra:
            extra["min_tokens"] = extra.pop("min_new_tokens")
        return args, extra

    def _call(
        self, text: str, messages: list[dict] | None, sampling_params: dict, stream: bool
    ) -> Any:
        args, extra = self._request(sampling_params)
        # not a completions argument of the client
        if not self.is_chat_model and "response_format" in args:
            extra["response_format"] = args.pop("response_format")
        common = dict(model=self.model_name, stream=stream, extra_body=extra or None, **args)
        if self.is_chat_model:
            return self.client.chat.completions.create(
                messages=self._chat_messages(text, messages), **common
            )
        return self.client.completions.create(prompt=text, **common)

    def _chat_messages(self, text: str, messages: list[dict] | None) -> list[dict]:
        prefix, _ = self.get_chat_template().get_prefix_and_suffix("assistant", messages or [])
        if messages is None or not text.endswith(prefix):
            raise ValueError(
                "on a chat model (sgl.OpenAI with is_chat_model=True) a gen must open the "
                "assistant's turn: s += sgl.assistant(sgl.gen(...)) after the other messages"
            )
        return [dict(m) for m in messages]

    @staticmethod
    def _meta(response: Any, choice: Any) -> dict:
        usage = response.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        return {
            "id": response.id,
            "finish_reason": {"type": choice.finish_reason},
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
            "cached_tokens": getattr(details, "cached_tokens", None),
        }

    def _text(self, choice: Any) -> str:
        return (choice.message.content or "") if self.is_chat_model else choice.text

    @staticmethod
    def _no_logprobs(options: dict) -> None:
        if options.get("return_logprob") or options.get("top_logprobs_num"):
            raise NotImplementedError(
                "return_logprob / top_logprobs_num are not available on sgl.OpenAI"
            )
        if options.get("lora_path"):
            raise NotImplementedError(
                "lora_path is not available on sgl.OpenAI: name the adapter as its model"
            )

    def generate(
        self,
        text: str,
        sampling_params: dict,
        program_id: str | None = None,
        session_id: str | None = None,
        messages: list[dict] | None = None,
        **logprob_options: Any,
    ) -> tuple[str | list[str], dict | list[dict]]:
        self._no_logprobs(logprob_options)
        response = self._call(text, messages, sampling_params, stream=False)
        texts = [self._text(c) for c in response.choices]
        metas = [self._meta(response, c) for c in response.choices]
        if sampling_params.get("n", 1) > 1:
            return texts, metas
        return texts[0], metas[0]

    def generate_stream(
        self,
        text: str,
        sampling_params: dict,
        program_id: str | None = None,
        session_id: str | None = None,
        messages: list[dict] | None = None,
        **logprob_options: Any,
    ) -> Iterator[tuple[str, dict]]:
        self._no_logprobs(logprob_options)
        meta: dict = {}
        for chunk in self._call(text, messages, sampling_params, stream=True):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            delta = (c.delta.content or "") if self.is_chat_model else c.text
            if c.finish_reason is not None:
                meta = {"id": chunk.id, "finish_reason": {"type": c.finish_reason}}
            yield delta, meta

    def select(
        self,
        prefix: str,
        choices: list[str],
        temperature: float,
        choices_method: Any,
        program_id: str | None = None,
        messages: list[dict] | None = None,
    ) -> ChoicesDecision:
        """By prompt logprobs where the server echoes them, else approximate (module docstring)."""
        unconditional = getattr(choices_method, "requires_unconditional_logprobs", False)
        scored = None
        if not self.is_chat_model and self._echo_logprobs is not False:
            scored = self._echo_scores(prefix, choices, unconditional)
        if scored is None:
            return self._select_by_generation(prefix, choices, program_id, messages)
        kwargs = dict(
            choices=choices,
            input_token_logprobs=scored[0],
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=scored[1],
        )
        if isinstance(choices_method, BUILTIN_METHODS):
            kwargs.update(temperature=temperature, rng=self._rng)
        decision = choices_method(**kwargs)
        info = {"method": "prompt logprobs (echo)", **(decision.meta_info or {})}
        return ChoicesDecision(decision.decision, info)

    def _echo_scores(self, prefix: str, choices: list[str], unconditional: bool) -> tuple | None:
        """Per choice, the (logprob, None, token) entries of its own tokens given the prefix (and
        with `unconditional`, of the same tokens alone); None where the server refuses echo."""
        echoed = self._echo([prefix + c for c in choices])
        if echoed is None:
            return None
        cond = [_tail_entries(lp, len(c)) for lp, c in zip(echoed, choices)]
        if not unconditional:
            return cond, None
        own = self._echo(["".join(e[2] for e in entries) for entries in cond])
        return None if own is None else (cond, [_tail_entries(lp, 1 << 30) for lp in own])

    def _echo(self, texts: list[str]) -> list[Any] | None:
        """Each text's echoed prompt logprobs, from one /v1/completions request that generates
        nothing; None, and not asked again, when the server refuses echo with logprobs."""
        import openai

        echoed = None
        try:
            response = self.client.completions.create(
                model=self.model_name, prompt=texts, echo=True, logprobs=0, max_tokens=0
            )
            echoed = [c.logprobs for c in sorted(response.choices, key=lambda c: c.index)]
            self._echo_logprobs = len(echoed) == len(texts) and all(
                lp is not None and lp.tokens and lp.text_offset for lp in echoed
            )
        except (openai.BadRequestError, openai.UnprocessableEntityError):
            self._echo_logprobs = False
        return echoed if self._echo_logprobs else None

    def _select_by_generation(
        self,
        prefix: str,
        choices: list[str],
        program_id: str | None,
        messages: list[dict] | None,
    ) -> ChoicesDecision:
        """Approximate: a greedy generation constrained to the choices."""
        pattern = "(?:" + "|".join(re.escape(c) for c in choices) + ")"
        params = {"max_new_tokens": MAX_CHOICE_TOKENS, "temperature": 0.0, "regex": pattern}
        text, meta = self.generate(prefix, params, program_id, messages=messages)
        decision = next(
            (c for c in sorted(choices, key=len, reverse=True) if text.startswith(c)), None
        )
        # the server ignored the constraint: the choice sharing the longest start
        if decision is None:
            decision = max(choices, key=lambda c: (len(os.path.commonprefix([c, text])), -len(c)))
        return ChoicesDecision(
            decision,
            {
                "method": "constrained greedy generation (approximate: no prompt "
                "logprobs over the OpenAI API)",
                "generated": text,
                **meta,
            },
        )

    def cache_prefix(self, text: str, program_id: str | None = None) -> dict:
        return {}  # no cache control over this API; the server may still cache prefixes itself

    def flush_cache(self) -> bool:
        raise NotImplementedError("flush_cache is not available on sgl.OpenAI")

    def get_server_info(self) -> dict:
        raise NotImplementedError("get_server_info is not available on sgl.OpenAI")

    def get_model_name(self) -> str:
        return self.model_name


def _tail_entries(logprobs: Any, tail_chars: int) -> list[tuple]:
    """The (logprob, None, token) entries of the echoed tokens that end within the text's last
    `tail_chars` characters (a token across that boundary included; at least the last token).
    Counted from the end, so a character split over byte-level tokens earlier on shifts nothing."""
    tokens, values, offsets = logprobs.tokens, logprobs.token_logprobs, logprobs.text_offset
    total = offsets[-1] + len(tokens[-1])
    ends = [*offsets[1:], total]
    first = next((i for i, end in enumerate(ends) if end > total - tail_chars), len(tokens) - 1)
    return [(values[i], None, tokens[i]) for i in range(first, len(tokens))]
