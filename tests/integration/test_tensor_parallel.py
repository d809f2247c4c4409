"""Tensor parallelism (model/tp.py, tp_shard.py) on gloo, CPU, fp32.

Truth: the same model at tp_size 1. A tiny random Llama with 4 query / 2 KV heads (saved with transformers,
the default model's tokenizer) at TP=2 (KV heads split) and TP=4 (KV heads replicated): every prompt and
output logprob, and the top-5 at each position, allclose to TP=1, greedy ids equal; the default model at TP=3
(9 query / 3 KV heads) equals TP=1 token for token; a TP=2 server answers like TP=1 over HTTP, and nodes
started with --nnodes 2 --node-rank 0/1 --dist-init-addr serve the same; killing a TP worker fails in-flight
requests within seconds and the server exits non-zero with no process left.
"""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest
import torch
from conftest_server import ServerProcess, free_port
from model_cases import save_random_model, tiny_moe_config

from radixrt import Engine
from radixrt.runtime.model.tp_shard import plan_shard

pytestmark = pytest.mark.integration
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
FAIL_DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir  # the session's tiny random Llama: 4 query / 2 KV heads


def run(model_path, tp_size, max_new_tokens=6):
    engine = Engine(model_path=model_path, dtype="float32", tp_size=tp_size, max_total_tokens=4096)
    try:
        outs = engine.generate(
            PROMPTS,
            {"temperature": 0, "max_new_tokens": max_new_tokens},
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=5,
        )
        engine.check_integrity()
        return outs
    finally:
        engine.shutdown()


def logprob_table(out) -> list[float]:
    """Every prompt and output logprob, and each position's top-5 logprobs, in order."""
    meta = out["meta_info"]
    values = [x[0] for x in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]]
    for top in meta["input_top_logprobs"][1:] + meta["output_top_logprobs"]:
        values += [x[0] for x in top]
    return values


@pytest.fixture(scope="module")
def qwen_dirs(tmp_path_factory, tokenizer):
    """Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms), 4 query / 2 KV heads, random weights."""
    from transformers import Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    dirs = {}
    for name, config in (
        ("qwen2", Qwen2Config(**common, tie_word_embeddings=False)),
        ("qwen3", Qwen3Config(**common, head_dim=16, tie_word_embeddings=True)),
    ):
        d = tmp_path_factory.mktemp(name)
        # biases and norms away from their init values, so sharding them matters
        save_random_model(config, tokenizer, d, seed=1)
        dirs[name] = str(d)
    return dirs


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_qwen_biases_and_qk_norms_shard(qwen_dirs, name):
    base, sharded = run(qwen_dirs[name], 1), run(qwen_dirs[name], 2)
    for a, b in zip(base, sharded):
        assert a["output_ids"] == b["output_ids"]
        torch.testing.assert_close(
            torch.tensor(logprob_table(b)), torch.tensor(logprob_table(a)), rtol=1e-4, atol=1e-4
        )


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, tokenizer):
    """Qwen2-MoE (a shared expert, a dense layer) and Mixtral (experts under block_sparse_moe),
    random weights, routers sharp enough that tokens spread over the experts."""
    dirs = {}
    for kind in ("qwen2_moe_shared_dense_layer", "mixtral_sliding"):
        d = tmp_path_factory.mktemp(kind)
        save_random_model(tiny_moe_config(kind), tokenizer, d, seed=2)
        dirs[kind] = str(d)
    return dirs


@pytest.mark.parametrize("kind", ["qwen2_moe_shared_dense_layer", "mixtral_sliding"])
def test_moe_experts_split_along_their_intermediate_size(moe_dirs, kind):
    """Each rank holds half of every expert (and of the shared expert); routing is replicated, the
    expert outputs sum in the all-reduce: TP=2 equals TP=1."""
    base, sharded = run(moe_dirs[kind], 1), run(moe_dirs[kind], 2)
    for a, b in zip(base, sharded):
        assert a["output_ids"] == b["output_ids"]
        torch.testing.assert_close(
            torch.tensor(logprob_table(b)), torch.tensor(logprob_table(a)), rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize("tp_size", [2, 4])
def test_tiny_model_logits_equal_tp1(tiny_dir, tp_size):
    base, sharded = run(tiny_dir, 1), run(tiny_dir, tp_size)
    for a, b in zip(base, sharded):
        assert a["output_ids"] == b["output_ids"]
        torch.testing.assert_close(
            torch.tensor(logprob_table(b)), torch.tensor(logprob_table(a)), rtol=1e-4, atol=1e-4
        )
        assert len(set(a["output_ids"])) > 1, "a degenerate model would compare nothing"


def test_shards_split_or_replicate_kv_heads(tiny_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_dir)
    assert [plan_shard(config, r, 2).kv_head_start for r in range(2)] == [0, 1]  # split
    assert [plan_shard(config, r, 4).kv_head_start for r in range(4)] == [0, 0, 1, 1]  # replicated
    with pytest.raises(ValueError, match="tp_size 3 does not divide num_attention_heads 4"):
        plan_shard(config, 0, 3)


def test_default_model_at_tp3_equals_tp1():
    base, sharded = run(None, 1, max_new_tokens=12), run(None, 3, max_new_tokens=12)
    assert [o["output_ids"] for o in sharded] == [o["output_ids"] for o in base]


def generate(url: str, prompt: str, max_new_tokens: int = 12) -> list[int]:
    r = httpx.post(
        url + "/generate",
        json={
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_tp2_server_and_two_nodes_answer_like_tp1(tmp_path_factory, tiny_dir):
    want = [o["output_ids"] for o in run(tiny_dir, 1, max_new_tokens=12)]
    server = ServerProcess(
        ["--model-path", tiny_dir, "--tp-size", "2", "--log-level", "warning"],
        tmp_path_factory.mktemp("tp2"),
    )
    try:
        assert [generate(server.url, p) for p in PROMPTS] == want
    finally:
        assert server.stop() == 0
    # two "machines": node 1 headless, node 0 serving, joined at --dist-init-addr
    addr = f"127.0.0.1:{free_port()}"
    multi = [
        "--model-path",
        tiny_dir,
        "--tp-size",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        addr,
        "--log-level",
        "warning",
        "--dtype",
        "float32",
    ]
    import subprocess
    import sys

    node1 = subprocess.Popen(
        [sys.executable, "-m", "radixrt.cli", "serve", *multi, "--node-rank", "1"]
    )
    try:
        server = ServerProcess([*multi, "--node-rank", "0"], tmp_path_factory.mktemp("tp2-nodes"))
        try:
            assert [generate(server.url, p) for p in PROMPTS] == want
        finally:
            assert server.stop() == 0
        assert node1.wait(30) == 0, "the headless node exits when rank 0 stops"
    finally:
        if node1.poll() is None:
            node1.kill()


def test_killing_a_tp_worker_fails_inflight_requests_and_exits(tmp_path_factory, tiny_dir):
    import threading

    server = ServerProcess(
        ["--model-path", tiny_dir, "--tp-size", "2", "--log-level", "warning"],
        tmp_path_factory.mktemp("tp-kill"),
    )
    try:
        workers = [
            p
            for p in server.ps.children(recursive=True)
            if "radixrt.runtime.model.tp" in " ".join(p.cmdline())
        ]
        assert len(workers) == 1, [p.cmdline() for p in server.ps.children(recursive=True)]
        results: list = []

        def slow():
            try:
                results.append(
                    httpx.post(
                        server.url + "/generate",
                        json={
                            "text": "Count:",
                            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
                        },
                        timeout=120,
                    )
                )  # seconds of decoding
            except httpx.HTTPError as e:
                results.append(e)

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        workers[0].send_signal(signal.SIGKILL)
        thread.join(60)
        assert results and time.monotonic() - killed_at < FAIL_DEADLINE_S
        r = results[0]
        assert isinstance(r, httpx.Response) and r.status_code >= 500, r
        assert server.proc.wait(30) != 0
        time.sleep(0.5)
        leftovers = [
            pid
            for pid in [server.proc.pid, *server.child_pids]
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
        assert leftovers == [], leftovers
    finally:
        server.stop(signal.SIGKILL)


def test_idle_workers_outlast_the_collective_timeout(tiny_dir):
    """Workers wait for the next plan on a group with no practical deadline: a server idle for longer than
    --dist-timeout (5 s here: on a slow 2-core machine a rank can take over 2 s to enter its first collective
    after idling, which a 2 s timeout failed) still answers; the forward's collectives keep the timeout."""
    engine = Engine(
        model_path=tiny_dir, dtype="float32", tp_size=2, max_total_tokens=1024, dist_timeout=5.0
    )
    try:
        first = engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": 4})
        time.sleep(8.0)
        again = engine.generate(PROMPTS[0], {"temperature": 0, "max_new_tokens": 4})
        assert again["output_ids"] == first["output_ids"]
    finally:
        engine.shutdown()
