"""Turning a layer function and its (tuple-nested) tensor arguments into an FX graph for Inductor:
the tensors as the graph's inputs (one graph serves every layer), only the token dimension of the
activations symbolic, and example inputs whose token count cannot be mistaken for another size."""

from __future__ import annotations

import hashlib
import inspect
from typing import Callable

import torch

from radixrt.runtime.model.compiled_kernels import pinned_vector_isa


def tensors_of(args: tuple) -> list[torch.Tensor]:
    """The tensors of (possibly tuple-nested) args, in flatten's order: the per-call half of
    flatten."""
    out: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, tuple):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def flatten(args: tuple) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], tuple]]:
    """Tensors of (possibly tuple-nested) args, and how to rebuild args from them: the graph's
    inputs are the tensors; None and ints (absent biases, out_features) are constants of the
    graph."""
    tensors: list[torch.Tensor] = []

    def skeleton(a):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            return len(tensors) - 1
        if isinstance(a, tuple):
            return tuple(skeleton(x) for x in a)
        return ("const", a)

    shape = [skeleton(a) for a in args]

    def rebuild(flat, s=None):
        if s is None:
            return tuple(rebuild(flat, x) for x in shape)
        if isinstance(s, int):
            return flat[s]
        if len(s) == 2 and s[0] == "const":
            return s[1]
        return tuple(rebuild(flat, x) for x in s)

    return tensors, rebuild


T_ARGS = {
    "attention_inputs": (0, -2, -1),
    "seam": (0, 1, -2, -1),
    "final": (0, 1),
}  # args whose dim 0 is T


def activations(name: str, args: tuple) -> set[int]:
    """ids of the arguments whose first dimension is the step's token count (h, o, cos, sin)."""
    return {id(args[i]) for i in T_ARGS[name]}


def trace(
    fn: Callable, flat: list[torch.Tensor], t_ids: set[int], static: bool
) -> torch.fx.GraphModule:
    """fn's FX graph over fake copies of flat: only dim 0 of the activations symbolic (or nothing,
    static)."""
    dims = [(0,) if id(t) in t_ids and not static else () for t in flat]
    return trace_dims(fn, flat, dims)


def trace_dims(
    fn: Callable, flat: list[torch.Tensor], dims: list[tuple[int, ...]]
) -> torch.fx.GraphModule:
    """fn's FX graph over fake copies of flat whose dims[i] dimensions (only those) are symbolic.
    make_fx's own symbolic mode would make every dim symbolic and unify equal sizes: a T of 2 traced
    that way becomes the same symbol as the 2 of a weight's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())

    def fake(t: torch.Tensor, dyn: tuple[int, ...]) -> torch.Tensor:
        sizes = [DimDynamic.DYNAMIC if j in dyn else DimDynamic.STATIC for j in range(t.dim())]
        return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))

    fakes = [fake(t, dyn) for t, dyn in zip(flat, dims)]
    symbolic = any(dims)
    # a tracing context: the regions fn marks (torch's invoke_subgraph) are traced once and every
    # call of one refers to the same subgraph
    with torch._guards.tracing(torch._guards.TracingContext(mode)):
        return make_fx(fn, tracing_mode="symbolic" if symbolic else "fake")(*fakes)


def example_inputs(flat: list[torch.Tensor], t_ids: set[int], bucket) -> list[torch.Tensor]:
    """flat with the activations at a token count no input has as another dimension: Inductor binds
    the graph's symbolic T to an input dimension of the example's value, and a T of 2 bound to a
    4-bit scale table's last dimension (2), or of 9 to the 9 heads of o, would size every later call
    by that dimension."""
    taken = {n for t in flat for j, n in enumerate(t.shape) if j or id(t) not in t_ids}
    num_tokens = free_size(taken, bucket.min_tokens, bucket.max_tokens)
    return [
        torch.zeros((num_tokens, *t.shape[1:]), dtype=t.dtype, device=t.device)
        if id(t) in t_ids
        else t
        for t in flat
    ]


def free_size(taken: set[int], lo: int, hi: int) -> int:
    """The smallest size in lo..hi that no other dimension has (lo when all do), now taken too."""
    n = next((n for n in range(lo, hi + 1) if n not in taken), lo)
    taken.add(n)
    return n


def graph_key(name: str, modules: tuple, inputs: list, dims: list, *extra) -> str:
    """A saved graph's file name: what it depends on (torch, the CPU vector ISA its kernels are
    generated for, the code of modules, each input's dtype, layout and shape with its symbolic dims
    as -1, and extra: the constants)."""
    code = "".join(inspect.getsource(m) for m in modules)
    shapes = [
        (str(t.dtype), t.is_mkldnn, tuple(-1 if j in dyn else n for j, n in enumerate(t.shape)))
        for t, dyn in zip(inputs, dims)
    ]
    text = repr((torch.__version__, pinned_vector_isa(), code, shapes, extra))
    return f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"
