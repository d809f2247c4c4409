"""The whole decode step as one compiled graph (model/step_graph.py) on tiny random models, against
transformers' own logits for every decode row (teacher forcing): one request alone, batches of
different lengths, batches whose requests borrow one prefix's slots (the cascade), a request whose
own part is only its newest token; the K/V the graph returns are written to the pool, so later
steps of any kind read them. No graph is compiled after the first call of each variant, and a
second StepGraphs over the same cache loads every graph."""

from __future__ import annotations

import pytest
import torch
from test_llama_tiny import atol_of, build, hf_logits, tiny_config

from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.model.compiled_layers import CompiledLayers
from radixrt.runtime.model.step_graph import CASCADE, PLAIN, StepGraphs

MAX_BS = 4


def compile_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["aot_autograd"]["total"])


def routed(driver, model, cache_dir) -> StepGraphs:
    """driver's decode batches through a StepGraphs, the other steps eager."""
    graphs = StepGraphs(CompiledLayers(model.eager_dims, MAX_BS, cache_dir), model, driver.kv)

    def forward(fb):
        if graphs.takes(fb):
            return model.head(graphs.run(fb), fb)
        return model.forward(fb, driver.kv, driver.attn)

    driver.forward = forward
    return graphs


def run_script(driver, seqs, check) -> None:
    """Prefills, forks of a's prompt, and decode batches of every variant; check(name, logits)
    after each step."""

    def step(feeds):
        out = driver.step(
            [(name, seqs[name][fed[name] : fed[name] + n], False) for name, n in feeds]
        )
        for name, n in feeds:
            fed[name] += n
            check(name, fed[name] - 1, out[name][0])

    fed = {name: 0 for name in seqs}
    step([("a", 40)])
    for _ in range(3):
        step([("a", 1)])  # one token
    for name in "bcd":  # a's prompt borrowed, as a radix-cache hit
        driver.share(name, "a", 40)
        fed[name] = 40
    step([("c", 5), ("d", 2)])
    for _ in range(3):
        step([("b", 1), ("c", 1), ("d", 1)])  # cascade; b's own part starts at one token
    step([("a", 1), ("b", 1), ("c", 1), ("d", 1)])  # cascade of four
    step([("e", 20)])
    for _ in range(2):
        step([("a", 1), ("e", 1)])  # plain, lengths differ
    step([("b", 3), ("e", 1)])  # mixed: eager, reading the graph's K/V
    step([("b", 1)])


@pytest.mark.parametrize("kind", ["llama", "qwen3_qk_norm"])
def test_decode_step_graph_matches_transformers(kind, tiny_llama_config, paged_driver, tmp_path):
    config = tiny_config(kind, tiny_llama_config)
    hf, ours, _ = build(config, seed=11)
    attn = TorchAttentionBackend(
        ours.num_q_heads, ours.num_kv_heads, ours.head_dim, min_shared_len=8, min_saved_kv=0
    )
    gen = torch.Generator().manual_seed(12)
    prompt = torch.randint(0, 128, (40,), generator=gen).tolist()
    seqs = {n: prompt + torch.randint(0, 128, (10,), generator=gen).tolist() for n in "abcd"}
    seqs["e"] = torch.randint(0, 128, (25,), generator=gen).tolist()
    expected = {name: hf_logits(hf, s) for name, s in seqs.items()}

    def check(name, pos, logits):
        torch.testing.assert_close(
            logits, expected[name][pos], atol=atol_of(kind), rtol=1e-5,
            msg=lambda m: f"{name} at position {pos}: {m}",
        )  # fmt: skip

    driver = paged_driver(ours, attn, num_pages=200, page_size=1, seed=13)
    graphs = routed(driver, ours, tmp_path)
    run_script(driver, seqs, check)
    variants = {(bucket, variant) for bucket, variant in graphs.runs}
    assert variants == {("one token", PLAIN), ("small batches", PLAIN), ("small batches", CASCADE)}
    assert graphs.num_compiles == 3

    # the same script again, over the same cache: every graph loaded, nothing compiled
    before = compile_count()
    driver = paged_driver(ours, attn, num_pages=200, page_size=1, seed=14)
    again = routed(driver, ours, tmp_path)
    run_script(driver, seqs, check)
    assert again.num_compiles == 0 and compile_count() == before
