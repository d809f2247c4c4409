"""LoRA adapters over HTTP on a real `radixrt serve --lora-paths ...` (float32): /generate's
lora_path (per prompt), the OpenAI routes' model naming an adapter ("name" or "base:name"),
/v1/models listing them, POST /load_lora_adapter and /unload_lora_adapter; outputs equal
transformers + peft; unknown names are 400s naming the problem and the server keeps serving. A
load reads only under --lora-dir, every refusal of its path or files one text; it is read off the
scheduler's loop (a stream in flight keeps streaming through a load slowed by
RADIXRT_LORA_READ_DELAY_S)."""

from __future__ import annotations

import os
import threading
import time

import httpx
import openai
import pytest
from conftest_server import ServerProcess
from test_lora_engine import PROMPTS, make_adapter, peft_greedy

from radixrt.runtime.model.lora_paths import REFUSED
from radixrt.runtime.serving.backend.lora_loads import READ_DELAY_ENV

MAX_NEW = 8
READ_DELAY_S = 1.5  # every load of this module's server reads this much longer (a slow disk)
ADMIN_KEY = "lora-admin-key"  # LoRA loads are admin routes


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
    root = os.path.dirname(adapters["late"][0])
    srv = ServerProcess(
        ["--lora-paths", *paths, "--lora-dir", root, "--max-loras-per-batch", "2"]
        + ["--max-loaded-loras", "4", "--max-total-tokens", "4096", "--admin-api-key", ADMIN_KEY],
        tmp_path_factory.mktemp("lora_srv"),
        env={READ_DELAY_ENV: str(READ_DELAY_S)},
    )
    yield srv
    srv.stop()


def post(server, path, body):
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=300)


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
    root = os.path.dirname(path)  # the --lora-dir: missing inside it reads as outside it
    for where in (os.path.join(root, "missing"), os.path.dirname(root), "/etc"):
        bad = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": where})
        assert bad.status_code == 400 and bad.json()["error"]["message"] == REFUSED, bad.text
        assert bad.json()["error"]["param"] == "lora_path" and where not in bad.text
    again = post(server, "/unload_lora_adapter", {"lora_name": "late"})
    assert again.status_code == 400 and "late" in again.text
    ok = post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


def test_a_slow_load_does_not_stall_a_running_stream(server, adapters):
    """The load's read takes READ_DELAY_S; a stream started before it keeps its pace meanwhile
    (a read on the loop would hold every token for the whole delay)."""
    load = {}

    def do_load():
        load["sent"] = time.monotonic()
        body = {"lora_name": "slow", "lora_path": adapters["late"][0]}
        load["res"] = post(server, "/load_lora_adapter", body)
        load["done"] = time.monotonic()

    loader = threading.Thread(target=do_load)
    body = {
        "text": PROMPTS[2],
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 3000, "ignore_eos": True},
    }
    chunks = []
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(time.monotonic())
                if len(chunks) == 1:
                    loader.start()
            if "done" in load:
                break  # closing the stream aborts the rest
    loader.join()
    assert load["res"].status_code == 200, load["res"].text
    assert load["done"] - load["sent"] >= READ_DELAY_S, "the read was not slowed"
    during = [t for t in chunks if load["sent"] <= t <= load["done"]]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert len(during) >= 3 and max(gaps) < READ_DELAY_S / 2, (len(during), gaps)
    assert post(server, "/unload_lora_adapter", {"lora_name": "slow"}).status_code == 200
