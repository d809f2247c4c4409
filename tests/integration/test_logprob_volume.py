"""#56.4: a request's logprob volume is bounded before anything runs. Every logprob item (a position's
token and each of its top alternatives, with its text when asked) is decoded and encoded on the
serving event loop, so positions x (1 + top_logprobs_num) x n, summed over the body's prompts, is
capped (prompt_checks.MAX_LOGPROB_ITEMS) with a 400 naming the field; what passes is decoded through a table
built once (each entry decode([id]), checked here for every id) and encoded by orjson. On a launched
server over the tiny model (the point is the edge, not what the weights know)."""

from __future__ import annotations

import httpx
import pytest
from conftest_server import ServerProcess

from radixrt.runtime.request.prompt_checks import MAX_LOGPROB_ITEMS
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

TOP = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        ["--model-path", tiny_model_dir, "--max-total-tokens", "16384", "--log-level", "warning"],
        tmp_path_factory.mktemp("logprob-volume"),
    )
    yield srv
    srv.stop()


def ids(n: int, first: int = 100) -> list[int]:
    return [first + i % 1000 for i in range(n)]


def generate(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/generate", json=body, timeout=120)


def prompt_logprobs(prompt, n: int = 1, top: int = TOP) -> dict:
    return {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 1, "n": n, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": top,
        "return_text_in_logprobs": True,
    }


def refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == field and str(MAX_LOGPROB_ITEMS) in err["message"], err


def test_one_prompt_over_the_cap_is_refused_before_it_runs(server):
    # 4,000 positions x 21 x n=2 = 168,000 items (the review's case was a 30k-token prompt)
    refused(generate(server, prompt_logprobs(ids(4000), n=2)), "logprob_start_len")
    # output logprobs count too: 4,000 new tokens x 21 x n=2
    body = {
        "input_ids": ids(10),
        "sampling_params": {"max_new_tokens": 4000, "n": 2},
        "return_logprob": True,
        "top_logprobs_num": TOP,
    }
    refused(generate(server, body), "top_logprobs_num")
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["num_requests_admitted"] == 0, info  # refused at the edge: nothing reached it


def test_the_prompts_of_one_body_share_the_cap(server):
    alone = 3500 * (1 + TOP) + 1 * (1 + TOP)  # each prompt's positions under the cap
    assert alone <= MAX_LOGPROB_ITEMS < 2 * alone
    body = prompt_logprobs([ids(3500), ids(3500, first=2000)])
    refused(generate(server, body), "logprob_start_len")


def test_under_the_cap_every_item_comes_with_its_text(server, tokenizer):
    prompt = ids(3000)
    r = generate(server, prompt_logprobs(prompt))
    assert r.status_code == 200, r.text[:300]
    meta = r.json()["meta_info"]
    got = meta["input_token_logprobs"]
    assert [t[1] for t in got] == prompt
    assert all(t[2] == tokenizer.decode([t[1]]) for t in got)
    tops = [row for row in meta["input_top_logprobs"] if row]
    assert len(tops) >= len(prompt) - 1 and all(len(row) == TOP for row in tops)
    assert all(alt[2] == tokenizer.decode([alt[1]]) for row in tops for alt in row)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_the_text_table_is_decode_of_each_id(tokenizer):
    tm = TokenizerManager.__new__(TokenizerManager)  # only the tokenizer is read
    tm.tokenizer, tm._token_texts = tokenizer, []
    tm._token_texts = tm._decode_vocabulary()
    assert len(tm._token_texts) == len(tokenizer)
    for i in range(len(tokenizer)):
        assert tm.token_text(i) == tokenizer.decode([i]), i
    assert tm.token_text(len(tokenizer) + 5) == tokenizer.decode([len(tokenizer) + 5])
