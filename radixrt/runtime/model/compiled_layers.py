"""The layer math as Inductor-compiled graphs, for the steps the whole-step decode graph
(step_graph.py) does not take: prefill chunks, mixed steps, drafts to verify.

What is compiled: the three pure functions of models/llama_layer.py (the first layer's attention
inputs, the seam between two attentions, the last layer's tail), with the weights as graph inputs,
so one graph serves every layer. Attention reads the paged pool with per-step Python metadata and
stays outside the graphs, as do the embedding and the lm_head. Inside a graph the norms, RoPE, SiLU
and the residual adds are fused C++ loops around the matmuls (torch.ops.radixrt.linear: oneDNN's
packed bf16 GEMM or the 4-bit kernel).

How: each function is traced once per bucket to an FX graph (make_fx; symbolic in the token count T
for the ranges) and compiled by torch._inductor.standalone_compile. The result is called directly,
without dynamo: dynamo's guard check and frame handling cost ~80 us a call on a small CPU, as much
as the fused kernels save, and there are 31 calls a step. Inductor's generated wrapper still checks
each input's size and stride.

Buckets of the step's token count T, each compiled once (at start-up, warm_up) and never again:
  one token         T = 1 (a single decode: static shapes)
  small batches     2 <= T <= --torch-compile-max-bs (decode batches; T symbolic, sized for them)
  large steps       T > --torch-compile-max-bs (prefill chunks and mixed steps; T symbolic)
The compiled graphs are saved under $RADIXRT_CACHE_DIR/compiled (keyed by torch's version, the layer
code and the shapes) and Inductor's own caches under $RADIXRT_CACHE_DIR/inductor, so a later start
loads them (nothing traced or compiled: ~4 s for all nine on a 2-core EPYC); each is saved with the
C++ kernels its compile built (compiled_kernels.py), so a new process loading it builds none.
Tracing: layer_tracing.py. Without a C++ compiler (Inductor's CPU code generation needs one) the
engine runs eager and says so once.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from radixrt.runtime.model import int4_weight, int8_weight, linear
from radixrt.runtime.model.compiled_kernels import (
    copy_kernels,
    pinned_vector_isa,
    recording_kernel_sources,
)
from radixrt.runtime.model.layer_tracing import (
    activations,
    example_inputs,
    flatten,
    graph_key,
    tensors_of,
    trace,
)
from radixrt.runtime.model.models import llama_layer
from radixrt.runtime.model.models.llama_layer import LayerDims

log = logging.getLogger(__name__)

MAX_TOKENS = 1 << 20  # the large-step bucket's upper bound (any real step is smaller)


@dataclass(frozen=True)
class Bucket:
    name: str
    min_tokens: int
    max_tokens: int

    @property
    def static(self) -> bool:
        return self.min_tokens == self.max_tokens


def buckets(max_bs: int) -> list[Bucket]:
    return [
        Bucket("one token", 1, 1),
        Bucket("small batches", 2, max_bs),
        Bucket("large steps", max_bs + 1, MAX_TOKENS),
    ]


def compiler_missing(device: torch.device) -> str | None:
    """Why Inductor cannot compile here, or None. On a CPU its generated code is C++: it needs a
    compiler."""
    if device.type != "cpu":
        return None
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None and shutil.which("c++") is None:
        return f"no C++ compiler ({cxx}) on PATH"
    return None


def why_eager(config: Any, device: torch.device, tensor_parallel: bool) -> str | None:
    """Why this engine runs its layers eager, or None to compile them. On by default on a CPU with a
    C++ compiler; --enable-torch-compile elsewhere (CUDA); --disable-torch-compile or
    RADIXRT_DISABLE_TORCH_COMPILE=1 (the test suite's default: compiling per test engine costs
    minutes) off."""
    if config.disable_torch_compile:
        return "--disable-torch-compile"
    if config.enable_deterministic_inference:
        # one set of kernels for every step size: Inductor's graphs are compiled per bucket of
        # token counts, each fusing its norms' reductions its own way
        return "--enable-deterministic-inference"
    if os.environ.get("RADIXRT_DISABLE_TORCH_COMPILE") == "1" and not config.enable_torch_compile:
        return "RADIXRT_DISABLE_TORCH_COMPILE=1"
    if tensor_parallel:
        return "tensor parallelism (its all-reduces sit between the matmuls)"
    if device.type != "cpu" and not config.enable_torch_compile:
        return f"on {device.type} only with --enable-torch-compile"
    return compiler_missing(device)


class CompiledLayers:
    """The compiled layer functions by bucket; model.forward calls attention_inputs / seam /
    final."""

    def __init__(
        self,
        dims: LayerDims,
        max_bs: int,
        cache_dir: pathlib.Path,
        plan: tuple[int, ...] = linear.DENSE_ONLY,
    ):
        """plan: the layers' weight plan (weight_plan.py); a bucket that reads int8 with dynamic
        activations throughout has that path traced into its graphs."""
        self.buckets = buckets(max_bs)
        self.dims = LayerDims(**{**dims.__dict__, "compiled": True})
        self.plan = plan
        self.cache_dir = cache_dir
        # (function name, bucket name) -> compiled
        self._graphs: dict[tuple[str, str], Callable] = {}
        self.num_compiles = 0  # graphs compiled (not loaded) in this process
        # graphs saved with kernels a new process would build
        self.to_build: list[pathlib.Path] = []
        self.compile_seconds: dict[str, float] = {}

    def dims_of(self, bucket: Bucket) -> LayerDims:
        fmt = linear.uniform_format(self.plan, bucket.min_tokens, bucket.max_tokens)
        traced = fmt if fmt in linear.TRACED_FORMATS else None
        if traced == linear.INT4 and not bucket.static:
            # a bucket of many row counts runs each layer as a region (torch's invoke_subgraph),
            # and torch 2.13's int4 kernel traced into a region fails when run ("group size must
            # be a scalar"): there it goes through the linear operator (a plan reading int4 up to
            # 32 rows, as an AVX2 machine's does, could not start a compiled engine)
            traced = None
        return LayerDims(**{**self.dims.__dict__, "traced_format": traced})

    def bucket_of(self, num_tokens: int) -> Bucket:
        return next(b for b in self.buckets if b.min_tokens <= num_tokens <= b.max_tokens)

    def attention_inputs(self, *args):
        return self._call("attention_inputs", args)

    def seam(self, *args):
        return self._call("seam", args)

    def final(self, *args):
        out = self._call("final", args)
        # a loaded graph returns its outputs as a list
        return out[0] if isinstance(out, (list, tuple)) else out

    def _call(self, name: str, args: tuple):
        flat = tensors_of(args)  # one level of nesting: the Linear.op_args tuples
        bucket = self.bucket_of(flat[0].shape[0])
        graph = self._graphs.get((name, bucket.name))
        if graph is None:
            graph = self._graphs[(name, bucket.name)] = self._load_or_compile(name, bucket, args)
        return graph(*flat)

    def _load_or_compile(self, name: str, bucket: Bucket, args: tuple) -> Callable:
        flat, rebuild = flatten(args)
        fn = partial(getattr(llama_layer, name), self.dims_of(bucket))
        t_ids = activations(name, args)

        def graph() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
            gm = trace(lambda *t: fn(*rebuild(list(t))), flat, t_ids, bucket.static)
            return gm, (flat if bucket.static else example_inputs(flat, t_ids, bucket))

        path = self.cache_dir / self._key(name, bucket, flat, rebuild)
        artifact, compiled, kernels_to_build = load_or_compile(path, graph, bucket.static)
        self.num_compiles += compiled
        if kernels_to_build:
            self.to_build.append(path)
        return artifact

    def _key(self, name: str, bucket: Bucket, flat: list[torch.Tensor], rebuild: Callable) -> str:
        """What the compiled graph depends on: torch, the layer code, the dims, each input's dtype
        and shape (the token dim as the bucket), the constants (absent biases, out_features)."""
        num_tokens = flat[0].shape[0]
        dims = [(0,) if t.shape and t.shape[0] == num_tokens else () for t in flat]
        modules = (llama_layer, linear, int8_weight, int4_weight)
        constants = rebuild(list(range(len(flat))))
        return graph_key(
            f"{name}-{bucket.min_tokens}",
            modules,
            flat,
            dims,
            self.dims_of(bucket),
            bucket,
            constants,
        )

    def warm_up(self, run_tokens: Callable[[int], None]) -> None:
        """Compile (or load) every bucket now: run_tokens(T) runs one forward of T tokens."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for bucket in self.buckets:
            t0 = time.perf_counter()
            run_tokens(bucket.min_tokens)
            self.compile_seconds[bucket.name] = time.perf_counter() - t0
        if self.to_build:
            load_in_a_new_process(self.to_build)
        log.info(
            "torch.compile: layer graphs for %s: %d compiled, %d loaded from %s in %.1f s (%s)",
            ", ".join(
                f"{b.name} ({b.min_tokens}..{b.max_tokens if b.max_tokens < MAX_TOKENS else 'any'} "
                "tokens)"
                for b in self.buckets
            ),
            self.num_compiles,
            len(self._graphs) - self.num_compiles,
            self.cache_dir,
            sum(self.compile_seconds.values()),
            ", ".join(f"{k} {v:.1f} s" for k, v in self.compile_seconds.items()),
        )


def load_or_compile(
    path: pathlib.Path,
    graph: Callable[[], tuple[torch.fx.GraphModule, list[torch.Tensor]]],
    static: bool,
) -> tuple[Callable, bool, bool]:
    """The compiled graph saved at path, or graph() (an FX graph and example inputs) compiled by
    Inductor now and saved there with its built kernels -> (callable, whether it was compiled,
    whether a new process loading it has kernels left to build)."""
    pinned_vector_isa()  # before any load or compile: the ISA the path's key names
    if path.exists():
        try:
            artifact = torch._inductor.CompiledArtifact.load(path=str(path), format="unpacked")
            return artifact, False, False
        except Exception as e:  # a stale or partial entry: compile it again
            log.warning(
                "torch.compile: could not load %s (%s: %s); compiling", path, type(e).__name__, e
            )
    gm, examples = graph()
    with recording_kernel_sources() as sources:
        artifact = torch._inductor.standalone_compile(
            gm, examples, dynamic_shapes="from_example_inputs" if static else "from_graph"
        )
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        artifact.save(path=str(tmp), format="unpacked")
        complete = copy_kernels(sources, tmp)
        os.replace(tmp, path)  # whole entries only: another process may be loading
    except OSError as e:
        log.warning("torch.compile: could not save %s: %s", path, e)
        shutil.rmtree(tmp, ignore_errors=True)
        return artifact, True, False
    return artifact, True, not complete


# A saved graph whose kernels could not all be copied (compiled_kernels.py) builds them on its
# first load in a new process, so the cold start that saved it has a child process load it once, in
# the background (the cold start does not wait for it), and warm starts find every kernel built. It
# runs at the lowest priority (SCHED_IDLE where there is one): on 2 cores the g++ it runs still
# slowed the requests right after a cold start ~10x at nice 19.
_LOAD_ALL = """
import os, sys
os.nice(19)
if hasattr(os, "SCHED_IDLE"):
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
import torch
import radixrt.runtime.model.linear  # registers torch.ops.radixrt.linear, which the graphs call
# the parent's vector width, not a probe of its own: at idle priority the probe's child could time
# out, and the kernels would be built for a width the parent never loads
if int(sys.argv[1]):
    cpp = torch._inductor.config.cpp
    cpp.vec_isa_ok, cpp.simdlen = True, int(sys.argv[1])
for path in sys.argv[2:]:
    torch._inductor.CompiledArtifact.load(path=path, format="unpacked")
"""


def load_in_a_new_process(paths: list[pathlib.Path]) -> subprocess.Popen | None:
    """Start the child that loads the saved graphs (its own session: it outlives a short run)."""
    pinned_vector_isa()
    simdlen = torch._inductor.config.cpp.simdlen
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _LOAD_ALL, str(simdlen or 0), *map(str, paths)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:  # only the next start is slower
        log.warning("torch.compile: could not load the saved graphs in a new process: %s", e)
        return None


def use_inductor_cache(cache_dir: str) -> None:
    """Inductor's on-disk caches (generated code, compiled kernels) under the engine's cache dir,
    unless the user pointed TORCHINDUCTOR_CACHE_DIR elsewhere."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache_dir, "inductor"))
