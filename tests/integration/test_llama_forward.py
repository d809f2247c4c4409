"""The real default model (SmolLM2-135M-Instruct, float32): our paged forward vs Hugging Face."""

from __future__ import annotations

import pytest
import torch

from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.model.models.llama import LlamaForCausalLM
from radixrt.runtime.model.weights import load_config, load_state_dict, resolve_model

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "List three prime numbers."},
    ],
]


@pytest.fixture(scope="module")
def ours(model_dir):
    model = LlamaForCausalLM(load_config(model_dir), torch.float32, "cpu")
    model.load_weights(load_state_dict(model_dir, torch.float32))
    return model, TorchAttentionBackend(model.num_q_heads, model.num_kv_heads, model.head_dim)


def chat_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_second_resolve_converts_nothing(model_dir, monkeypatch):
    from radixrt.runtime.model import gguf_weights, weights

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached copy was converted again")

    first = resolve_model(None)  # the quantised copy the server reads
    monkeypatch.setattr(weights, "_convert_gguf", no_conversion)
    monkeypatch.setattr(gguf_weights, "convert", no_conversion)
    assert weights.transformers_dir() == model_dir
    assert resolve_model(None) == first


def test_shapes_of_default_model(ours):
    model, _ = ours
    assert (
        model.num_layers,
        model.num_q_heads,
        model.num_kv_heads,
        model.head_dim,
        model.vocab_size,
    ) == (30, 9, 3, 64, 49152)
    assert model.max_context == 8192


def test_prefill_logits_match_hf(ours, hf_model, tokenizer, paged_driver):
    model, attn = ours
    ids = chat_ids(tokenizer, PROMPTS[0])
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0]
    driver = paged_driver(model, attn, num_pages=64, page_size=16, seed=1)
    # in two chunks, so the second attends to a cached prefix through scattered pages
    cut = len(ids) // 2
    got = torch.cat(
        (driver.step([("a", ids[:cut], True)])["a"], driver.step([("a", ids[cut:], True)])["a"])
    )
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_greedy_decode_matches_hf_generate(ours, hf_model, tokenizer, paged_driver):
    """Two chats decoded together (batched decode, one joining late) equal HF generate token for token."""
    model, attn = ours
    num_new = 20
    prompts = [chat_ids(tokenizer, m) for m in PROMPTS]
    expected = []
    for ids in prompts:
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=num_new,
                pad_token_id=tokenizer.eos_token_id,
            )
        # ends early with the EOS id if the model stops
        expected.append(out[0, len(ids) :].tolist())
    assert all(len(e) >= 8 for e in expected), expected

    driver = paged_driver(model, attn, num_pages=512, page_size=1, seed=3)
    outputs: list[list[int]] = [[], []]

    def done(i: int) -> bool:
        return len(outputs[i]) == num_new or (
            outputs[i] and outputs[i][-1] == tokenizer.eos_token_id
        )

    def step(feeds):
        logits = driver.step(feeds)
        for name, _, _ in feeds:
            outputs[int(name[1])].append(int(logits[name][0].argmax()))

    step([("r0", prompts[0], False)])
    # r1's prefill joins r0's decode
    step([("r0", outputs[0][-1:], False), ("r1", prompts[1], False)])
    while not (done(0) and done(1)):
        step([(f"r{i}", outputs[i][-1:], False) for i in range(2) if not done(i)])
    assert outputs == expected, (tokenizer.decode(outputs[0]), tokenizer.decode(expected[0]))


def test_served_gguf_weights_equal_transformers_reading_of_the_file(model_dir):
    """The server reads the default GGUF kept quantised (resolve_model); every weight it builds
    equals transformers' float32 conversion of the same file (the tests' reference)."""
    from radixrt.runtime.model import gguf_weights

    served_dir = resolve_model(None)
    assert gguf_weights.is_quantized_dir(served_dir) and served_dir != model_dir
    served = load_state_dict(served_dir, torch.float32)
    ref = load_state_dict(model_dir, torch.float32)
    assert set(served) == set(ref)
    for name, t in ref.items():
        assert torch.equal(served[name], t), name
