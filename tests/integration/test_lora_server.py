"""LoRA adapters over HTTP on a real `radixrt serve --lora-paths ...` (float32): /generate's
lora_path (per prompt), the OpenAI routes' model naming an adapter ("name" or "base:name"),
/v1/models listing them, POST /load_lora_adapter and /unload_lora_adapter; outputs equal
transformers + peft; bad adapters and unknown names are 400s naming the problem and the server
keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest_server import ServerProcess
from test_lora_engine import PROMPTS, make_adapter, peft_greedy

MAX_NEW = 8


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_http")
    specs = {"qv4": (4, ["q_proj", "v_proj"], 11), "mlp8": (8, ["gate_proj", "down_proj"], 12)}
    specs["late"] = (4, ["o_proj", "k_proj"], 13)
    return {
        name: (str(root / name), make_adapter(model_dir, str(root / name), r, targets, seed))
        for name, (r, targets, seed) in specs.items()
    }


@pytest.fixture(scope="module")
def server(adapters, tmp_path_factory):
    paths = [f"{n}={adapters[n][0]}" for n in ("qv4", "mlp8")]
    srv = ServerProcess(
        ["--lora-paths", *paths, "--max-loras-per-batch", "2", "--max-total-tokens", "4096"],
        tmp_path_factory.mktemp("lora_srv"),
    )
    yield srv
    srv.stop()


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=300)


def test_generate_with_adapters_per_prompt(server, adapters, hf_model, tokenizer):
    loras = ["qv4", "mlp8", None]
    res = post(
        server,
        "/generate",
        {
            "input_ids": [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:3]],
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW},
            "lora_path": loras,
        },
    )
    assert res.status_code == 200, res.text
    for prompt, lora, out in zip(PROMPTS, loras, res.json()):
        model = hf_model if lora is None else adapters[lora][1]
        assert out["output_ids"] == peft_greedy(model, tokenizer, prompt, MAX_NEW)[:MAX_NEW]


def test_openai_routes_name_the_adapter_as_the_model(server, adapters, tokenizer):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=300)
    ids = [m.id for m in client.models.list().data]
    assert ids[1:] == ["mlp8", "qv4"]
    want = peft_greedy(adapters["qv4"][1], tokenizer, PROMPTS[0], MAX_NEW)
    for model in ("qv4", f"{ids[0]}:qv4"):
        out = client.completions.create(
            model=model, prompt=PROMPTS[0], max_tokens=MAX_NEW, temperature=0
        )
        assert out.choices[0].text == tokenizer.decode(want[:MAX_NEW], skip_special_tokens=True)
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.completions.create(model="nope", prompt="Hi", max_tokens=2)


def test_load_and_unload_over_http(server, adapters, tokenizer):
    path, model = adapters["late"]
    loaded = post(server, "/load_lora_adapter", {"lora_name": "late", "lora_path": path})
    assert loaded.status_code == 200 and "late" in loaded.json()["loaded_adapters"], loaded.text
    res = post(
        server,
        "/generate",
        {
            "text": PROMPTS[1],
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW},
            "lora_path": "late",
        },
    )
    assert res.json()["output_ids"] == peft_greedy(model, tokenizer, PROMPTS[1], MAX_NEW)[:MAX_NEW]
    gone = post(server, "/unload_lora_adapter", {"lora_name": "late"})
    assert gone.status_code == 200 and "late" not in gone.json()["loaded_adapters"]
    refused = post(server, "/generate", {"text": "Hi", "lora_path": "late"})
    assert refused.status_code == 400 and "lora_path" in refused.text and "late" in refused.text
    bad = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/dir"})
    assert bad.status_code == 400 and "adapter_config.json" in bad.text
    again = post(server, "/unload_lora_adapter", {"lora_name": "late"})
    assert again.status_code == 400 and "late" in again.text
    ok = post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200
