"""RuntimeEndpoint: a radixrt (or SGLang-compatible) server over HTTP as a backend.

Routes used: POST /generate, GET /get_model_info, GET /get_server_info, POST
/flush_cache; when the server has them, POST /tokenize, POST /pin_prefix and POST /unpin
(a 404 turns the feature off). A server that cannot be reached is an error naming the URL.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Iterator

import requests

from radixrt.frontend.backends import Backend, BackendError

_CONNECT_TIMEOUT_S = 10.0


class RuntimeEndpoint(Backend):
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: Any = None,
        chat_template_name: str | None = None,
    ):
        super().__init__()
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"RuntimeEndpoint needs an http(s):// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self._local = threading.local()
        self.supports_pin = True  # until the server answers 404
        self._has_tokenize: bool | None = None
        self._local_tokenizer: Any = None
        self.model_info = self._call("GET", "/get_model_info").json()

    # ---- HTTP ---------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        # requests.Session is not thread-safe; programs call from many threads.
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False
        return session

    def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        stream: bool = False,
        allow_404: bool = False,
    ) -> requests.Response | None:
        url = self.base_url + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            res = self._session().request(
                method,
                url,
                json=payload,
                headers=headers,
                stream=stream,
                timeout=(_CONNECT_TIMEOUT_S, None),
                verify=self.verify,
            )
        except requests.ConnectionError as e:
            raise ConnectionError(
                f"cannot reach the radixrt server at {self.base_url} ({type(e).__name__}); "
                f"is `radixrt serve` running there?"
            ) from None
        except requests.Timeout:
            raise ConnectionError(
                f"the radixrt server at {self.base_url} did not answer within "
                f"{_CONNECT_TIMEOUT_S:.0f} s"
            ) from None
        if res.status_code == 404 and allow_404:
            return None
        if res.status_code != 200:
            try:
                body = res.json()
                detail = (
                    body.get("error", body.get("detail", body.get("message", body)))
                    if isinstance(body, dict)
                    else body
                )
                if isinstance(detail, dict):
                    detail = detail.get("message", detail)
            except ValueError:
                detail = res.text
            what = f"{method} {url} -> {res.status_code}: {detail}"
            if res.status_code in (401, 403):
                raise PermissionError(f"{what} (pass api_key= to RuntimeEndpoint)")
            raise (ValueError if 400 <= res.status_code < 500 else BackendError)(what)
        return res

    @staticmethod
    def _body(payload: dict) -> dict:
        body = {k: v for k, v in payload.items() if v is not None}
        if "prompt" in body:
            body["text"] = body.pop("prompt")
        return body

    def _generate(self, **payload: Any) -> Any:
        return self._call("POST", "/generate", self._body(payload)).json()

    def _generate_stream(self, **payload: Any) -> Iterator[tuple[str, dict]]:
        body = self._body({**payload, "stream": True})
        res = self._call("POST", "/generate", body, stream=True)
        sent = ""
        with res:
            for line in res.iter_lines(decode_unicode=False):
                if not line or not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and "text" not in chunk:
                    raise BackendError(f"{self.base_url}/generate stream failed: {chunk['error']}")
                text = chunk.get("text", "")
                # SGLang servers send the text so far; take what is new.
                delta = text[len(sent) :] if text.startswith(sent) else text
                sent = text if text.startswith(sent) else sent + text
                yield delta, chunk.get("meta_info", {})

    # ---- tokenizer and chat template ----------------------------------------------------
    def _tokenizer_dir(self) -> str | None:
        for key in ("tokenizer_path", "model_path"):
            path = self.model_info.get(key)
            if isinstance(path, str) and os.path.isdir(path):
                return path
        return None

    def tokenize(self, text: str) -> list[int] | None:
        if self._has_tokenize is not False:
            res = self._call(
                "POST", "/tokenize", {"text": text, "add_special_tokens": False}, allow_404=True
            )
            if res is not None:
                self._has_tokenize = True
                body = res.json()
                return list(body.get("tokens", body.get("input_ids", [])))
            self._has_tokenize = False
        if self._local_tokenizer is None:
            directory = self._tokenizer_dir()
            path = os.path.join(directory, "tokenizer.json") if directory else None
            if path is None or not os.path.exists(path):
                return None
            from tokenizers import Tokenizer  # the Rust tokenizer: no torch

            self._local_tokenizer = Tokenizer.from_file(path)
        return self._local_tokenizer.encode(text, add_special_tokens=False).ids

    def _template_source(self) -> tuple[str | None, str, str]:
        info = self.model_info
        template, bos, eos = (
            info.get("chat_template"),
            info.get("bos_token") or "",
            info.get("eos_token") or "",
        )
        directory = self._tokenizer_dir()
        if template is None and directory is not None:
            config_path = os.path.join(directory, "tokenizer_config.json")
            if os.path.exists(config_path):
                with open(config_path) as f:
                    config = json.load(f)
                template = config.get("chat_template")
                bos, eos = (
                    bos or _token_str(config.get("bos_token")),
                    eos or _token_str(config.get("eos_token")),
                )
            jinja_path = os.path.join(directory, "chat_template.jinja")
            if template is None and os.path.exists(jinja_path):
                with open(jinja_path) as f:
                    template = f.read()
        return template, bos, eos

    # ---- the rest of the interface ------------------------------------------------------
    def get_model_info(self) -> dict:
        return self.model_info

    def get_model_name(self) -> str:
        return self.model_info.get("model_path", "")

    def pin_prefix(self, text: str, program_id: str | None = None) -> Any:
        res = self._call(
            "POST", "/pin_prefix", {"text": text, "program_id": program_id}, allow_404=True
        )
        if res is None:
            self.supports_pin = False
            return None
        return res.json()["handle"]

    def unpin(self, handle: Any) -> None:
        self._call("POST", "/unpin", {"handle": handle}, allow_404=True)

    def close_session(self, session_id: str) -> None:
        self._call("POST", "/close_session", {"session_id": session_id})

    def flush_cache(self, empty_cache: bool = True) -> bool:
        res = self._call("POST", "/flush_cache", {})
        try:
            body = res.json()
            return bool(body.get("success", True)) if isinstance(body, dict) else True
        except ValueError:
            return True

    def get_server_info(self) -> dict:
        return self._call("GET", "/get_server_info").json()

    def health(self) -> bool:
        try:
            return (
                self._session()
                .get(self.base_url + "/health", timeout=_CONNECT_TIMEOUT_S)
                .status_code
                == 200
            )
        except requests.RequestException:
            return False


def _token_str(token: Any) -> str:
    if isinstance(token, dict):  # AddedToken serialized
        return token.get("content", "")
    return token or ""
