"""y = x W^T (+ b), with the weight prepacked for oneDNN where that is faster.

On a CPU with native bf16 (dtype_choice.py), oneDNN's GEMM reads a weight stored in its own blocked
layout much faster than a plain row-major one: on a 2-core EPYC the default model's matmuls of a
decode step take 18.5 ms instead of 29 ms at 16 rows, 13.4 instead of 19 at one row, and prefill
chunks reach ~420 GFLOP/s instead of ~380 (benchmarks/bench_vs_vllm.py measures the engine). The
packed weight serves any number of rows and gives the same values as F.linear. Elsewhere (float32,
CUDA, a torch without the op) the weight stays a plain tensor and F.linear runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixrt.runtime.model import int4_weight
from radixrt.runtime.model.int4_weight import Int4Weight

# The matmul as one operator that torch.compile'd graphs call (compiled_layers.py): Inductor lowers
# oneDNN's packed linear only for frozen constants, and a graph whose weights are constants is one
# graph per layer (minutes to compile on a small CPU). Behind this operator the weights are graph
# inputs, so one graph serves every layer; the kernel it runs is the eager path's own
# (Linear.__call__). A torch.library operator costs ~5 us a call; torch.library.custom_op's wrapper
# ~40 us, which is why it is not one.
_LIB = torch.library.Library("radixrt", "DEF")
_LIB.define(
    "linear(Tensor x, Tensor w, Tensor? bias, Tensor? int4_packed, Tensor? int4_scales, "
    "int out_features) -> Tensor"
)


def linear_kernel(x, w, bias, int4_packed, int4_scales, out_features):
    if int4_packed is not None and x.shape[0] <= int4_weight.MAX_ROWS:
        return int4_weight.matmul(x, int4_packed, int4_scales)
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")
    return F.linear(x, w, bias)


def _linear_shape(x, w, bias, int4_packed, int4_scales, out_features):
    return x.new_empty((x.shape[0], out_features))


for _key in ("CPU", "MkldnnCPU", "CUDA"):
    _LIB.impl("linear", linear_kernel, _key)
_LIB.impl("linear", _linear_shape, "Meta")

# The row count oneDNN is told to expect: decode batches; it serves 1..256+ rows nearly as well.
PACK_BATCH_HINT = 16


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN's bf16 path, where this CPU and torch build have it (an explicit --dtype bfloat16 on a
    CPU without avx512 bf16 support runs plain F.linear)."""
    if not (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported()) if supported is not None else True


class Linear:
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        prepack: bool = True,
        int4: Int4Weight | None = None,
    ):
        """int4: the same weight as 4-bit groups (int4_weight.py), used for steps of at most
        int4_weight.MAX_ROWS rows of a bf16 model; its bias-free matmul is the only difference."""
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.int4 = int4 if bias is None and weight.dtype == torch.bfloat16 else None
        self.packed = prepack and can_prepack(weight)
        # the plain weight is dropped when packed: the packed copy is the only one kept
        self.weight = weight
        if self.packed:
            try:
                self.weight = torch.ops.mkldnn._reorder_linear_weight(
                    weight.contiguous(), PACK_BATCH_HINT
                )
            except RuntimeError:  # the op exists but refuses this CPU: the plain path it is
                self.packed = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features]."""
        return linear_kernel(x, *self.op_args())

    def op_args(self) -> tuple:
        """What torch.ops.radixrt.linear takes after x: plain tensors, so a compiled graph can take
        them as inputs (the same graph for every layer)."""
        int4 = self.int4
        return (
            self.weight,
            self.bias,
            int4.packed if int4 else None,
            int4.scales_and_zeros if int4 else None,
            self.out_features,
        )

    def numel(self) -> int:
        return self.out_features * self.in_features
