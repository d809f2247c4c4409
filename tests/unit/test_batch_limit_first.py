"""#56.2: the sequence limit (max_prompts_per_request: prompts x n, or a beam search's width) is the
first check after a body is parsed, on /generate and /v1/completions: a small body asking for
millions of sequences is a 400 naming the limit before any prompt is tokenized, any sampling dict
is checked or any request is built. Truth: the real app (create_app) over a tokenizer manager whose
per-prompt work fails the test if it is ever reached. Also (#56.9) the ids of /close_session and
/unpin, refused by size before anything is sent."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from starlette.testclient import TestClient

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.serving.http.http_app import create_app
from radixrt.runtime.serving.http.metrics import ServerMetrics
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

LIMIT = 256  # the default


class PerPromptWork(AssertionError):
    pass


class StubTM:
    """The real sequence check; every per-prompt step raises."""

    check_num_sequences = TokenizerManager.check_num_sequences

    def __init__(self) -> None:
        self.config = ServerConfig()
        self.scheduler = SimpleNamespace(
            metrics=ServerMetrics(), states={}, lora_adapters={}, dead_reason=None
        )
        self.tokenizer = SimpleNamespace(chat_template=None, bos_token=None, eos_token="</s>")

    async def encode(self, *a, **k):
        raise PerPromptWork("a prompt was tokenized")

    async def validate_sampling(self, *a, **k):
        raise PerPromptWork("a sampling dict was checked")

    async def admit(self, *a, **k):
        raise PerPromptWork("a request was checked or built")

    def generate(self, *a, **k):
        raise PerPromptWork("requests were sent")


@pytest.fixture(scope="module")
def http():
    app = create_app(StubTM(), "stub-model")
    return TestClient(app, base_url="http://127.0.0.1:30000", raise_server_exceptions=True)


def post(http, path: str, body: dict):
    return http.post(path, content=orjson.dumps(body), headers={"content-type": "application/json"})


def refused_naming_the_limit(r) -> None:
    assert r.status_code == 400, r.text
    assert "max_prompts_per_request" in r.json()["error"]["message"], r.text


MANY_IDS = [[7]] * 300_000  # ~1.2 MB of JSON


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": MANY_IDS, "sampling_params": {"n": 16}},
        {"input_ids": MANY_IDS},
        {"text": ["a"] * 300_000, "sampling_params": {"max_new_tokens": 1}},
        {"input_ids": [[7]] * 20, "sampling_params": {"beam_width": 16}},
        {"input_ids": [[7]] * 2, "sampling_params": [{"n": 200}, {"n": 57}]},
        {"input_ids": [7, 8], "sampling_params": {"n": LIMIT + 1}},
    ],
    ids=["ids-x-n", "ids", "texts", "beams", "per-prompt-n", "one-prompt-n"],
)
def test_generate_refuses_before_any_per_prompt_work(http, body):
    refused_naming_the_limit(post(http, "/generate", body))


@pytest.mark.parametrize(
    "body",
    [
        {"model": "default", "prompt": MANY_IDS, "n": 16},
        {"model": "default", "prompt": ["a"] * 300_000},
        {"model": "default", "prompt": [[7]] * 20, "n": 13},
        {"model": "default", "prompt": "hi", "n": 2, "best_of": LIMIT + 1, "use_beam_search": True},
    ],
    ids=["ids-x-n", "texts", "n", "beams"],
)
def test_completions_refuse_before_any_per_prompt_work(http, body):
    refused_naming_the_limit(post(http, "/v1/completions", body))


def test_at_the_limit_the_work_begins(http):
    """The check counts exactly: LIMIT sequences pass it (and reach the per-prompt work)."""
    for path, body in (
        ("/generate", {"input_ids": [[7]] * (LIMIT // 4), "sampling_params": {"n": 4}}),
        ("/v1/completions", {"model": "default", "prompt": [[7]] * (LIMIT // 4), "n": 4}),
    ):
        with pytest.raises(PerPromptWork):
            post(http, path, body)


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/close_session", {"session_id": "s" * 1_000_000}, "session_id"),
        ("/close_session", {"session_id": "s", "cache_salt": "t" * 100_000}, "cache_salt"),
        ("/close_session", {"session_id": ""}, "session_id"),
        ("/unpin", {"handle": "h" * 1_000_000}, "handle"),
    ],
)
def test_session_and_pin_ids_are_bounded_before_they_are_sent(http, path, body, field):
    """#56.9: /close_session's and /unpin's ids are bounded as where they are made (a session id,
    a salt, a pin handle): an unbounded one was sent on to the scheduler."""
    r = post(http, path, body)
    assert r.status_code == 400 and field in r.text, r.text[:300]
