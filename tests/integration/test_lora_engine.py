"""LoRA adapters on the default model against transformers + peft (the truth), in float32.

Random adapters made with `peft` (ranks 4 and 8, different targets, all seven projections in one)
and saved in PEFT's format; the Engine serves them by name. Greedy outputs of every adapter equal
peft's, in one batch mixing three adapters and the base model with only two adapter slots (the
third adapter's requests wait for a slot); the same prompt under two adapters shares no cached
token, and a prefix is reused under its own adapter; adapters load and unload at run time (an
unloaded one is refused by name, its cache entries gone); bad adapters are refused naming the
problem; every page comes back.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from radixrt.runtime.core.namespaces import KEY_STRIDE
from radixrt.runtime.engine.engine import Engine
from radixrt.runtime.model.lora_paths import REFUSED, LoraRefused

PROMPTS = [
    "The capital of France is",
    "def add(a, b):",
    "Once upon a time, a fox",
    "Water boils at",
]
GREEDY = {"temperature": 0, "max_new_tokens": 10}
ADAPTERS = {  # name: (rank, targets, seed)
    "qv4": (4, ["q_proj", "v_proj"], 1),
    "mlp8": (8, ["o_proj", "gate_proj", "up_proj", "down_proj", "k_proj"], 2),
    "all4": (4, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 3),
}


def make_adapter(model_dir, path, rank, targets, seed, alpha=None):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha or 2 * rank,
        target_modules=targets,
        init_lora_weights=False,  # B random too: an adapter that changes the output
        lora_dropout=0.0,
    )
    model = get_peft_model(base, config)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.05)
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    """The engine's --lora-dir: run-time loads read only under it."""
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def adapters(model_dir, lora_root):
    root = lora_root
    out = {}
    for name, (rank, targets, seed) in ADAPTERS.items():
        path = str(root / name)
        out[name] = (path, make_adapter(model_dir, path, rank, targets, seed))
    return out


@pytest.fixture(scope="module")
def engine(adapters, lora_root):
    paths = [f"{name}={adapters[name][0]}" for name in ("qv4", "mlp8")]
    eng = Engine(
        dtype="float32",
        lora_paths=paths,
        lora_dir=[str(lora_root)],
        max_loras_per_batch=2,
        max_total_tokens=4096,
    )
    eng.load_lora_adapter("all4", adapters["all4"][0])  # loaded at run time
    yield eng
    eng.shutdown()


def peft_greedy(model, tokenizer, prompt: str, max_new: int) -> list[int]:
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=1,
        )
    return out[0, len(ids) :].tolist()


def test_adapters_equal_peft_in_one_mixed_batch(engine, adapters, hf_model):
    loras = ["qv4", "mlp8", "all4", None] * 2
    prompts = PROMPTS + PROMPTS[::-1]
    outs = engine.generate(prompts, GREEDY, lora_path=loras)
    for prompt, lora, out in zip(prompts, loras, outs):
        model = hf_model if lora is None else adapters[lora][1]
        want = peft_greedy(model, engine.tokenizer, prompt, GREEDY["max_new_tokens"])
        assert out["output_ids"] == want[: len(out["output_ids"])], (lora, prompt)
    base = {o["text"] for o, lora in zip(outs, loras) if lora is None and o}
    assert all(o["text"] not in base for o, lora in zip(outs, loras) if lora is not None)
    engine.check_integrity()


def test_the_cache_is_keyed_by_adapter(engine):
    prompt = "A long shared instruction that every request of this test repeats word for word: "
    engine.flush_cache()
    first = engine.generate(prompt + "one", GREEDY, lora_path="qv4")
    assert first["meta_info"]["cached_tokens"] == 0
    other = engine.generate(prompt + "one", GREEDY, lora_path="mlp8")
    assert other["meta_info"]["cached_tokens"] == 0, "KV of another adapter reused"
    assert other["output_ids"] != first["output_ids"]
    base = engine.generate(prompt + "one", GREEDY)
    assert base["meta_info"]["cached_tokens"] == 0, "an adapter's KV reused by the base model"
    again = engine.generate(prompt + "two", GREEDY, lora_path="qv4")
    assert again["meta_info"]["cached_tokens"] >= 15, "its own adapter's prefix not reused"
    view = engine.get_cache_tree(max_depth=2)
    keys = {child["lora_key"] for child in view["root"]["children"]}
    assert None in keys and len(keys) >= 3
    engine.check_integrity()


def test_load_use_unload(engine, adapters, model_dir, lora_root):
    path = str(lora_root / "late")
    late = make_adapter(model_dir, path, 4, ["q_proj", "down_proj"], 7)
    engine.load_lora_adapter("late", path)
    out = engine.generate(PROMPTS[0], GREEDY, lora_path="late")
    assert out["output_ids"] == peft_greedy(late, engine.tokenizer, PROMPTS[0], 10)[:10]

    def keys():
        return {c["lora_key"] for c in engine.get_cache_tree(max_depth=1)["root"]["children"]}

    late_key = engine.scheduler.namespaces.key_offset("late", None) // KEY_STRIDE
    assert late_key in keys()
    engine.unload_lora_adapter("late")
    with pytest.raises(ValueError, match="'late' is not loaded"):
        engine.generate(PROMPTS[0], GREEDY, lora_path="late")
    assert late_key not in keys(), "the unloaded adapter's cache entries stayed"
    with pytest.raises(ValueError, match="already loaded"):
        engine.load_lora_adapter("qv4", adapters["qv4"][0])
    engine.check_integrity()


def refused(engine, name, path, why):
    """A run-time load refused with the one text (a client learns nothing of the file system);
    the exception's detail, which the server log gets, names the problem."""
    with pytest.raises(LoraRefused) as e:
        engine.load_lora_adapter(name, path)
    assert str(e.value) == REFUSED and why in e.value.detail, e.value.detail


def test_bad_adapters_are_refused_naming_the_problem(engine, adapters, model_dir, lora_root):
    bad = lora_root / "bad"
    os.makedirs(bad / "empty")
    with open(bad / "empty" / "adapter_config.json", "w") as f:
        json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8}, f)
    refused(engine, "empty", str(bad / "empty"), "no adapter_model.safetensors")
    refused(engine, "nothing", str(bad / "does-not-exist"), "no adapter_config.json")
    refused(engine, "outside", os.path.dirname(lora_root), "outside every --lora-dir")
    big = str(bad / "big")
    make_adapter(model_dir, big, 16, ["q_proj"], 4)
    refused(engine, "big", big, "rank 16, above --max-lora-rank 8")
    head = str(bad / "head")
    make_adapter(model_dir, head, 4, ["q_proj", "lm_head"], 5)
    refused(engine, "head", head, "lm_head")
    shapes = bad / "shapes"
    with open(os.path.join(adapters["qv4"][0], "adapter_config.json")) as f:
        config = json.load(f)
    os.makedirs(shapes)
    with open(shapes / "adapter_config.json", "w") as f:
        json.dump({**config, "r": 2}, f)  # the weights are rank 4
    import shutil

    shutil.copy(os.path.join(adapters["qv4"][0], "adapter_model.safetensors"), shapes)
    refused(engine, "shapes", str(shapes), "has shape")
    with pytest.raises(ValueError, match="'nope' is not loaded"):
        engine.generate("Hi", GREEDY, lora_path="nope")
    assert "big" not in engine.scheduler.runner.lora_names()
    engine.check_integrity()


def test_the_dsl_passes_lora_path_through_gen_and_run(engine):
    import radixrt as sgl

    @sgl.function
    def two(s, prompt):
        s += prompt
        s += sgl.gen("first", max_tokens=6, temperature=0, lora_path="qv4")
        s += sgl.gen("second", max_tokens=6, temperature=0)

    backend = sgl.EngineBackend(engine)
    state = two.run(prompt=PROMPTS[0], backend=backend, lora_path="mlp8")
    want_first = engine.generate(
        PROMPTS[0], {"temperature": 0, "max_new_tokens": 6}, lora_path="qv4"
    )
    assert state["first"] == want_first["text"]
    text = PROMPTS[0] + state["first"]
    want_second = engine.generate(text, {"temperature": 0, "max_new_tokens": 6}, lora_path="mlp8")
    assert state["second"] == want_second["text"]
    engine.check_integrity()


def test_adapters_on_a_tiny_random_model_equal_peft(model_dir, tmp_path, tiny_llama_config):
    """A tiny random Llama (conftest's config with the default model's vocabulary, saved with
    transformers, that tokenizer beside it) and two adapters of different ranks and targets on it,
    in one batch with its base model."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    config = tiny_llama_config
    config.vocab_size = len(tok)
    config.max_position_embeddings = 512
    config.initializer_range = 0.3  # peaked logits: greedy picks far from ties
    tiny_dir = tmp_path / "tiny"
    LlamaForCausalLM(config).save_pretrained(tiny_dir)
    tok.save_pretrained(tiny_dir)
    specs = {"t4": (4, ["q_proj", "k_proj", "up_proj"], 21), "t8": (8, ["v_proj", "o_proj"], 22)}
    models = {
        name: make_adapter(tiny_dir, str(tmp_path / name), r, targets, seed)
        for name, (r, targets, seed) in specs.items()
    }
    base = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    paths = [f"{n}={tmp_path / n}" for n in specs]
    eng = Engine(model_path=str(tiny_dir), dtype="float32", lora_paths=paths, max_total_tokens=2048)
    try:
        loras = ["t4", None, "t8", "t4"]
        outs = eng.generate(PROMPTS, GREEDY, lora_path=loras)
        for prompt, lora, out in zip(PROMPTS, loras, outs):
            model = base if lora is None else models[lora]
            want = peft_greedy(model, eng.tokenizer, prompt, GREEDY["max_new_tokens"])
            assert out["output_ids"] == want[: len(out["output_ids"])], (lora, prompt)
        eng.check_integrity()
    finally:
        eng.shutdown()
