"""Fault injection (core/faults.py): a stage raises for the request whose prompt carries a marker
token. On the Engine and on a launched server, that request fails with an error, the others in the
same batch give exactly what they give alone, nothing leaks, and the server keeps serving. Both run
the session's tiny random Llama with the default tokenizer (tests/conftest.py): the truth is a run
with the fault agreeing with runs without it, which holds for any weights."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
from conftest_server import ServerProcess

from radixrt import Engine
from radixrt.runtime.core.faults import ENV_VAR

MARK = 30_000  # a token id no innocent prompt here contains
GREEDY = {"temperature": 0, "max_new_tokens": 10}


def prompts(tokenizer) -> list[list[int]]:
    texts = ["The capital of France is", "Write a word that rhymes with cat:", "1, 2, 3, 4,"]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("stage", ["sample", "apply", "intake"])
def test_engine_fails_only_the_culprit(stage, monkeypatch, tokenizer, tiny_model_dir):
    ok = prompts(tokenizer)
    culprit = ok[0][:3] + [MARK] + ok[0][3:]
    monkeypatch.setenv(ENV_VAR, f"{stage}:{MARK}")
    engine = Engine(model_path=tiny_model_dir, dtype="float32", max_total_tokens=4096)
    try:
        alone = [engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in ok]
        outs = engine.generate(input_ids=[ok[0], culprit, ok[1], ok[2]], sampling_params=GREEDY)
        bad = outs[1]["meta_info"]
        assert bad["finish_reason"]["type"] == "abort" and "injected fault" in bad["error"], bad
        assert [o["output_ids"] for o in (outs[0], outs[2], outs[3])] == alone
        assert engine.generate(input_ids=ok[2], sampling_params=GREEDY)["output_ids"] == alone[2]
        engine.check_integrity()
        assert engine.flush_cache()
        info = engine.get_server_info()
        assert info["kv_pages_free"] == info["kv_pages_total"]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    srv = ServerProcess(
        ["--model-path", tiny_model_dir, "--max-total-tokens", "4096", "--log-level", "error"],
        tmp_path_factory.mktemp("faults"),
        env={ENV_VAR: f"sample:{MARK},forward:{MARK + 1}"},
    )
    yield srv
    srv.stop(signal.SIGKILL if srv.proc.poll() is None else signal.SIGTERM)


def test_server_fails_only_the_culprit_and_keeps_serving(server, tokenizer):
    ok = prompts(tokenizer)

    async def run(culprit_mark: int):
        async with httpx.AsyncClient(timeout=120) as client:

            def gen(ids):
                return client.post(
                    server.url + "/generate", json={"input_ids": ids, "sampling_params": GREEDY}
                )

            return await asyncio.gather(
                gen(ok[0]), gen(ok[1][:2] + [culprit_mark] + ok[1][2:]), gen(ok[2])
            )

    alone = [
        httpx.post(
            server.url + "/generate", json={"input_ids": p, "sampling_params": GREEDY}, timeout=120
        ).json()["output_ids"]
        for p in ok
    ]
    first, bad, third = asyncio.run(run(MARK))  # attributable: only the culprit fails
    # the client gets an error id, the server's log the exception's text
    message = bad.json()["error"]["message"]
    assert bad.status_code == 500 and "injected fault" not in message, bad.text
    error_id = message.split("error id ")[1].split(";")[0]
    assert f"error id {error_id}): internal error: PlanItemError: injected fault" in server.log()
    assert first.json()["output_ids"] == alone[0] and third.json()["output_ids"] == alone[2]
    # not attributable: the step's requests fail, the server goes on
    outs = asyncio.run(run(MARK + 1))
    assert outs[1].status_code == 500
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    again = httpx.post(
        server.url + "/generate", json={"input_ids": ok[0], "sampling_params": GREEDY}, timeout=120
    )
    assert again.json()["output_ids"] == alone[0]
    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 200
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    assert info["kv_pages_free"] == info["kv_pages_total"] and info["integrity_ok"], info
    assert info["num_step_failures"] >= 2
