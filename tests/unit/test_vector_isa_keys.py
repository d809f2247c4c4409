"""Compiled code is never built for a vector width other than the one it was generated for.

Inductor picks the CPU's vector ISA once per process (ATEN_CPU_CAPABILITY, else a probe whose child
process has 60 s to load a kernel per ISA), and its graph cache's key does not name the ISA. A run
that emulated an AVX2 machine on an AVX-512 one left 8-wide loops in Inductor's cache; CI's next
run on the same machine loaded them in a process that picked AVX-512 and built them 16 wide, and
every full-vector store wrote 32 bytes past its buffer: the heap corruption that aborted
test_step_graph in CI (a probe timing out under load would do the same). Here processes share
Inductor's cache and radixrt's graph folder, the first told to use AVX2, the next native, under
glibc's checking allocator where there is one: it must compile its own graph (its own key) and
compute the right numbers; a third, native too, finds that graph.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

# an embedding gather fused with an RMS norm: the kernel whose int64 index and float row Inductor
# tiles by the ISA's float width (the first kernel of every decode step graph)
SCRIPT = """
import json, pathlib, sys, torch
from torch._inductor.cpu_vec_isa import pick_vec_isa
from radixrt.runtime.model.compiled_layers import load_or_compile
from radixrt.runtime.model.layer_tracing import graph_key, trace_dims
from torch._dynamo.utils import counters

def embed_norm(ids, table, weight):
    x = table[ids]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

g = torch.Generator().manual_seed(0)
inputs = [torch.tensor([3, 77]), torch.randn(128, 72, generator=g), torch.randn(72, generator=g)]
key = graph_key("embed-norm", (), inputs, [(), (), ()])
fn, compiled, _ = load_or_compile(
    pathlib.Path(sys.argv[1]) / key,
    lambda: (trace_dims(embed_norm, inputs, [(), (), ()]), inputs),
    static=True,
)
out = fn(*inputs)
out = out[0] if isinstance(out, (tuple, list)) else out
print(json.dumps({
    "isa": f"{pick_vec_isa()}-{pick_vec_isa().bit_width()}",
    "key": key,
    "compiled": bool(compiled),
    "fx_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
    "error": (out - embed_norm(*inputs)).abs().max().item(),
}))
"""
CHECKING_MALLOC = pathlib.Path("/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0")


def compile_in_a_process(graphs: pathlib.Path, inductor: pathlib.Path, **env: str) -> dict:
    # the ISAs the CPU's flags name taken as built (Inductor's own probe builds and loads a kernel
    # per ISA in a child process: ~15 s a process, and what it decides is not this test's point)
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),
        "TORCHINDUCTOR_VEC_ISA_OK": "1",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(graphs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_code_generated_for_avx2_is_not_built_for_a_wider_isa(tmp_path):
    graphs, inductor = tmp_path / "graphs", tmp_path / "inductor"
    narrow = compile_in_a_process(graphs, inductor, ATEN_CPU_CAPABILITY="avx2")
    assert narrow["isa"] == "avx2-256" and narrow["compiled"] and narrow["error"] < 1e-5
    checking = {"LD_PRELOAD": str(CHECKING_MALLOC), "MALLOC_CHECK_": "3"}
    native = compile_in_a_process(
        graphs, inductor, **(checking if CHECKING_MALLOC.exists() else {})
    )
    if native["isa"] == narrow["isa"]:
        pytest.skip(f"this CPU's widest vectors are {native['isa']}: nothing wider to mismatch")
    assert native["key"] != narrow["key"], "radixrt's key must name the vector ISA"
    assert native["compiled"], "the AVX2 process's saved graph must not be loaded"
    assert native["fx_cache_hits"] == 0, "Inductor's cached AVX2 code must not be reused"
    assert native["error"] < 1e-5

    # the same width again: found, not compiled (the key is stable)
    again = compile_in_a_process(graphs, inductor)
    assert again["key"] == native["key"] and not again["compiled"] and again["error"] < 1e-5
