"""The whole decode step as one compiled graph per bucket: the CPU's analogue of a CUDA graph.

compiled_layers.py compiles the math between two attentions, so a step is still 31 graph calls and
30 attention calls from Python, with the torch backend's gathers between them: on a small CPU that
Python and dispatch is about a quarter of a batch-1 step (9.1 -> 7.1 ms on a 2-core AMX Xeon). Here
the step of a decode batch (every row one request's next token) is one graph: the embedding, all
layers with their attention over the paged pool (read in place: llama_step.paged_attention; the
cascade's shared prefix through the CPU flash kernel), the final norm; the matmuls are
torch.ops.radixrt.linear (the weight plan's kernels) inside it. The lm_head and the sampler stay
outside (the head's float32 refinement picks rows by data).

Graphs, each traced once with the batch size B (small batches), each request's own KV length L and
the shared prefix's length S symbolic, compiled by Inductor, saved beside the layer graphs and
loaded on a later start (never traced or compiled again):
  one token       B = 1, the layers unrolled
  small batches   2 <= B <= --torch-compile-max-bs, without and with a shared prefix (cascade); each
                  layer a region (invoke_subgraph) Inductor compiles once and calls 30 times, which
                  halves the compile (~15 s a graph on a 2-core Xeon) for ~1 ms of calls a step
Any other step (prefill chunks, mixed steps, drafts to verify) runs the layer graphs. The graph
mutates none of its inputs (models/llama_step.py): it returns the step's new keys and values, which
run() writes into the pool after it.
"""

from __future__ import annotations

import collections
import logging
import time
from functools import partial
from typing import Any, Callable

import torch

from radixrt.kernels import attention_math
from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.model import int4_weight, int8_weight, linear
from radixrt.runtime.model.compiled_layers import (
    Bucket,
    CompiledLayers,
    load_or_compile,
)
from radixrt.runtime.model.forward_batch import ForwardBatch
from radixrt.runtime.model.kv_cache import KVCache
from radixrt.runtime.model.layer_tracing import flatten, free_size, graph_key, trace_dims
from radixrt.runtime.model.models import llama_layer, llama_step

log = logging.getLogger(__name__)

PLAIN, CASCADE = "plain", "cascade"


def why_not(model: Any, kv: KVCache, attn: Any) -> str | None:
    """Why this engine's decode steps cannot run as one graph, or None."""
    if not model.compilable or model.layerwise:
        return f"{type(model).__name__} runs its layers one graph at a time"
    if any(w is not None for w in model.layer_windows):
        return "sliding-window layers"
    if not isinstance(attn, TorchAttentionBackend):
        return f"the {type(attn).__name__} attention backend"
    if kv.k_scale is not None:
        return f"a quantised KV pool ({kv.dtype})"
    return None


class StepGraphs:
    def __init__(self, layers: CompiledLayers, model: Any, kv: KVCache):
        """layers: the engine's layer graphs, whose buckets, weight plan and cache this shares; kv:
        the pool the graphs read."""
        self.layers = layers
        self.max_bs = layers.buckets[1].max_tokens
        self.scale = model.scale
        self.kv = kv
        weights = (model.embed, model.rope_cos, model.rope_sin, model.final_norm, _layers(model))
        weights, self._rebuild = flatten(weights)
        self._fixed = [kv.k_all, kv.v_all, *weights]  # every graph's inputs after the step's own
        self._graphs: dict[tuple[str, str], Callable] = {}
        self.num_compiles = 0
        self.runs: collections.Counter = collections.Counter()  # steps by (bucket, variant)

    def takes(self, fb: ForwardBatch) -> bool:
        """Whether this forward is a decode batch the step graphs run."""
        meta = fb.attn_meta
        return (
            fb.num_decode == fb.num_tokens == len(fb.seq_lens_list) <= self.max_bs
            and meta.decode is not None
            and not meta.extends
        )

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """The step's final-normed hidden rows [B, H] (model dtype); writes its K/V to the pool."""
        d = fb.attn_meta.decode
        shared = d.shared
        kv_idx = d.kv_idx.view(d.num_reqs, d.kv_len)
        own_lens = fb.seq_lens - (shared.kv_len if shared else 0)
        if d.kv_len < 2:  # graphs are traced for L >= 2: a masked column (slot 0) pads it
            kv_idx = torch.cat((kv_idx, torch.zeros_like(kv_idx)), dim=1)
        own = [fb.input_ids, fb.positions, kv_idx, own_lens]
        if shared is not None:
            own.append(shared.kv_idx)
        bucket = self.layers.bucket_of(d.num_reqs)
        key = (bucket.name, CASCADE if shared else PLAIN)
        graph = self._graphs.get(key)
        if graph is None:  # not warmed up (a test's engine)
            graph = self._graphs[key] = self._load_or_compile(bucket, key[1])
        self.runs[key] += 1
        x, new_k, new_v = graph(*own, *self._fixed)
        self.kv.k_all.index_copy_(1, fb.out_slots, new_k)
        self.kv.v_all.index_copy_(1, fb.out_slots, new_v)
        return x

    def warm_up(self) -> None:
        """Compile (or load) every variant now, and call each once on throwaway inputs (the graph
        writes nothing)."""
        one, small = self.layers.buckets[0], self.layers.buckets[1]
        for bucket, variant in ((one, PLAIN), (small, PLAIN), (small, CASCADE)):
            if bucket.max_tokens < bucket.min_tokens:  # --torch-compile-max-bs 1
                continue
            t0 = time.perf_counter()
            graph = self._graphs[(bucket.name, variant)] = self._load_or_compile(bucket, variant)
            graph(*self._example_inputs(bucket, variant))
            seconds = time.perf_counter() - t0
            self.layers.compile_seconds[f"decode step ({bucket.name}, {variant})"] = seconds

    def _load_or_compile(self, bucket: Bucket, variant: str) -> Callable:
        num_act = 5 if variant == CASCADE else 4
        # the one-token graph unrolled (its own Python calls per layer are a seventh of a batch-1
        # step), the batch graphs with each layer a region compiled once (half the compile time)
        regions = not bucket.static
        fn = partial(llama_step.decode_step, self.layers.dims_of(bucket), self.scale, regions)

        def run(*t):
            shared = t[4] if variant == CASCADE else None
            return fn(
                *t[:4], shared, *t[num_act : num_act + 2], *self._rebuild(list(t[num_act + 2 :]))
            )

        examples = self._example_inputs(bucket, variant)
        dims = _dynamic_dims(bucket, variant, len(examples))
        modules = (llama_step, llama_layer, linear, int8_weight, int4_weight, attention_math)
        skeleton = self._rebuild(list(range(len(self._fixed) - 2)))
        name = graph_key(
            f"step-{variant}-{bucket.min_tokens}",
            modules,
            examples,
            dims,
            self.layers.dims_of(bucket),
            bucket,
            self.scale,
            skeleton,
        )
        path = self.layers.cache_dir / name
        t0 = time.perf_counter()
        artifact, compiled, kernels_to_build = load_or_compile(
            path, lambda: (trace_dims(run, examples, dims), examples), static=False
        )
        self.num_compiles += compiled
        if kernels_to_build:
            self.layers.to_build.append(path)
        log.info(
            "torch.compile: the whole decode step (%s, %s) %s in %.1f s",
            bucket.name,
            variant,
            "compiled" if compiled else "loaded",
            time.perf_counter() - t0,
        )
        return artifact

    def _example_inputs(self, bucket: Bucket, variant: str) -> list[torch.Tensor]:
        """Throwaway inputs of a variant: B (within the bucket), L >= 2 and S >= 2 at sizes no
        static dim has (Inductor binds a symbol to an input dimension of its value: see
        layer_tracing.example_inputs)."""
        taken = {n for t in self._fixed for n in t.shape}
        b = 1 if bucket.static else free_size(taken, bucket.min_tokens, bucket.max_tokens)
        kv_len, shared_len = free_size(taken, 2, 1 << 20), free_size(taken, 2, 1 << 20)
        ids = torch.zeros((b,), dtype=torch.int64, device=self.kv.k_all.device)
        own = [ids, ids.clone(), ids.new_zeros((b, kv_len)), ids.new_full((b,), kv_len)]
        if variant == CASCADE:
            own.append(ids.new_zeros((shared_len,)))
        return own + self._fixed


def _layers(model: Any) -> tuple:
    """Each layer's weights as llama_step.LayerArgs."""
    return tuple(
        (
            layer.input_norm,
            layer.qkv.op_args(),
            layer.qk_norm,
            layer.o.op_args(),
            layer.post_norm,
            layer.gate_up.op_args(),
            layer.down.op_args(),
        )
        for layer in model.layers
    )


def _dynamic_dims(bucket: Bucket, variant: str, num_inputs: int) -> list[tuple[int, ...]]:
    """The symbolic dims of each input: B (not in the one-token bucket), L, S."""
    b = () if bucket.static else (0,)
    dims: list[tuple[int, ...]] = [b, b, (*b, 1), b] + ([(0,)] if variant == CASCADE else [])
    return dims + [()] * (num_inputs - len(dims))
