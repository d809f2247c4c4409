"""The compiled layer graphs (model/compiled_layers.py) and whole-step decode graphs (model/step_graph.py)
on the default model in float32: the same greedy tokens as the eager model for batches of every bucket (one
token, small decode batches with and without a shared prefix, prefill chunks and mixed steps); no graph
compiled after start-up however the batches vary; a second engine over the same cache loads every graph
instead of compiling it."""

from __future__ import annotations

import pytest

from radixrt import Engine
from radixrt.runtime.model import compiled_layers

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "List three primary colors:",
    "def fibonacci(n):",
    "Once upon a time",
    "The quick brown fox",
    "1, 2, 3, 4,",
    "Q: Why is the sky blue?",
]


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory, model_dir):
    mp = pytest.MonkeyPatch()
    mp.setenv("RADIXRT_CACHE_DIR", str(tmp_path_factory.mktemp("compile-cache")))
    mp.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    yield {"model_path": str(model_dir), "dtype": "float32", "torch_compile_max_bs": 8}
    mp.undo()


def generate_varied(engine: Engine) -> list[list[int]]:
    """Batches of 1, 3 and 8 decodes, a prompt longer than a chunk (prefill steps), and a mixed batch."""
    params = {"temperature": 0, "max_new_tokens": 12}
    outs = [engine.generate(PROMPTS[0], params)["output_ids"]]
    outs += [o["output_ids"] for o in engine.generate(PROMPTS[1:4], params)]
    outs += [o["output_ids"] for o in engine.generate(PROMPTS, params)]
    # ~600 tokens: chunks of 512, then a mixed step with the others
    long_prompt = " ".join(PROMPTS) * 12
    outs += [o["output_ids"] for o in engine.generate([long_prompt] + PROMPTS[:3], params)]
    # decode batches borrowing one cached prefix (the whole-step graph's cascade)
    prefix = " ".join(PROMPTS) * 2
    engine.generate(prefix, {"temperature": 0, "max_new_tokens": 1})
    outs += [o["output_ids"] for o in engine.generate([prefix + p for p in PROMPTS], params)]
    return outs


def common_prefix_fraction(got: list[list[int]], want: list[list[int]]) -> float:
    """The share of tokens before each sequence's first difference from its reference."""
    same = 0
    for g, w in zip(got, want, strict=True):
        same += next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
    return same / sum(len(w) for w in want)


def compile_count() -> int:
    """Graphs AOTAutograd has compiled in this process (every Inductor compile goes through it)."""
    from torch._dynamo.utils import counters

    return int(counters["aot_autograd"]["total"])


_LOAD_AND_RUN = """
import os, pathlib, sys, torch
import radixrt.runtime.model.linear  # registers the op the graphs call
from radixrt.runtime.model.compiled_kernels import pinned_vector_isa
pinned_vector_isa()
for path in pathlib.Path(sys.argv[1]).iterdir():
    torch._inductor.CompiledArtifact.load(path=str(path), format="unpacked")
"""


def built_by_a_new_process(cache_env) -> list[str]:
    """The files a new process's load of every saved graph adds to their folders (a C++ kernel it
    built, or Inductor's ISA probe built in a graph's folder)."""
    import os
    import pathlib
    import subprocess
    import sys

    folder = pathlib.Path(os.environ["RADIXRT_CACHE_DIR"]) / "compiled"
    before = {p for p in folder.rglob("*") if p.is_file() and "locks" not in p.parts}
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder.parent / "inductor")}
    subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(folder)], env=env, check=True)
    after = {p for p in folder.rglob("*") if p.is_file() and "locks" not in p.parts}
    return sorted(str(p.relative_to(folder)) for p in after - before)


# dense weights; int8 weights x dynamically quantised activations at every row count (the plan's
# form traced into the graphs, quantisation fused there)
@pytest.mark.parametrize("quantization", ["none", "w8a8_int8"])
def test_compiled_equals_eager_and_never_recompiles(cache_env, quantization):
    cache_env = {**cache_env, "quantization": quantization}
    eager = Engine(**cache_env, disable_torch_compile=True)
    try:
        assert eager.scheduler.runner.graphs is None
        want = generate_varied(eager)
    finally:
        eager.shutdown()
    engine = Engine(**cache_env, enable_torch_compile=True)
    try:
        graphs = engine.scheduler.runner.graphs
        # 3 functions x 3 buckets, at start-up
        steps = engine.scheduler.runner.step_graphs
        assert graphs is not None and graphs.num_compiles == 9
        # the whole decode step: one token; small batches without and with a shared prefix
        assert steps is not None and steps.num_compiles == 3
        compiled_at_start = compile_count()
        got = generate_varied(engine)
        assert graphs.num_compiles == 9 and steps.num_compiles == 3, "compiled after start-up"
        assert {variant for _, variant in steps.runs} == {"plain", "cascade"}, steps.runs
        assert compile_count() == compiled_at_start, "Inductor compiled after start-up"
        # every graph saved with the kernels its compile built: no background build needed
        assert graphs.to_build == [], graphs.to_build
        if quantization == "none":
            assert got == want
        else:  # the graph fuses quantisation differently: a near tie may flip, garbage would not
            assert common_prefix_fraction(got, want) >= 0.8, (got, want)
        engine.check_integrity()
    finally:
        engine.shutdown()
    # a new process loads and runs every saved graph without building a kernel
    assert built_by_a_new_process(cache_env) == []
    # a later start: every graph from the cache
    again = Engine(**cache_env, enable_torch_compile=True)
    try:
        assert again.scheduler.runner.graphs.num_compiles == 0
        assert again.scheduler.runner.step_graphs.num_compiles == 0
        assert common_prefix_fraction(generate_varied(again), got) == 1.0
    finally:
        again.shutdown()


def test_why_eager(cache_env, monkeypatch):
    import torch

    from radixrt.runtime.config import ServerConfig

    cpu = torch.device("cpu")
    monkeypatch.delenv("RADIXRT_DISABLE_TORCH_COMPILE")
    assert compiled_layers.why_eager(ServerConfig(), cpu, False) is None
    assert "disable" in compiled_layers.why_eager(
        ServerConfig(disable_torch_compile=True), cpu, False
    )
    assert "tensor parallel" in compiled_layers.why_eager(ServerConfig(), cpu, True)
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "no C++ compiler" in compiled_layers.why_eager(ServerConfig(), cpu, False)
    with pytest.raises(ValueError, match="contradict"):
        ServerConfig(enable_torch_compile=True, disable_torch_compile=True)
