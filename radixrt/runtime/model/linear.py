"""y = x W^T (+ b), in the weight format the step's row count reads fastest (weight_plan.py).

A Linear may hold a weight in up to three forms:
  dense     the model dtype's weight; on a CPU with native bf16 prepacked for oneDNN, whose GEMM
            reads its own blocked layout much faster than a row-major one (13.4 ms instead of 19
            for a one-row step of the default model on a 2-core EPYC)
  int4      the exact 4-bit codes of a Q4 GGUF's groups (int4_weight.py)
  int8      one int8 value per weight and a scale per output channel (int8_weight.py), read with
            the activations as they are (int8) or quantised per row (int8-dyn)
and a plan: for each range of row counts the format to read. A form no range reads is dropped once
the plan is set, so only what runs is kept in memory. Without a plan the dense weight serves every
row count.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixrt.runtime.model import int4_weight, int8_weight, invariant_matmul
from radixrt.runtime.model.int4_weight import Int4Weight
from radixrt.runtime.model.int8_weight import Int8Weight

# format codes in a plan (the operator below takes them as ints); INVARIANT: the dense weight in
# fixed row tiles, each row's bits independent of the row count (invariant_matmul.py)
DENSE, INT4, INT8, INT8_DYN, INVARIANT = 0, 1, 2, 3, 4
FORMAT_NAMES = {DENSE: "dense", INT4: "int4", INT8: "int8", INT8_DYN: "int8-dyn"}
FORMAT_NAMES[INVARIANT] = "invariant"
MAX_ROWS = 1 << 30
# formats a compiled graph calls the kernel of itself when its bucket reads only that one (ATen ops
# Inductor calls with graph inputs; oneDNN's packed dense linear it lowers only for constants)
TRACED_FORMATS = (INT4, INT8, INT8_DYN)
DENSE_ONLY = (MAX_ROWS, DENSE)  # a plan: (max rows, format, max rows, format, ...) ascending
INVARIANT_ONLY = (MAX_ROWS, INVARIANT)

# The matmul as one operator that torch.compile'd graphs call (compiled_layers.py): Inductor lowers
# oneDNN's packed linear only for frozen constants, and a graph whose weights are constants is one
# graph per layer (minutes to compile on a small CPU). Behind this operator the weights are graph
# inputs, so one graph serves every layer; the kernel it runs is the eager path's own
# (Linear.__call__). A torch.library operator costs ~5 us a call; torch.library.custom_op's wrapper
# ~40 us, which is why it is not one.
_LIB = torch.library.Library("radixrt", "DEF")
_LIB.define(
    "linear(Tensor x, Tensor? w, Tensor? bias, Tensor? int4_packed, Tensor? int4_scales, "
    "Tensor? int8_weight, Tensor? int8_scales, int[] plan, int out_features) -> Tensor"
)


def format_for(plan, rows: int) -> int:
    for i in range(0, len(plan), 2):
        if rows <= plan[i]:
            return plan[i + 1]
    return plan[-1]


def uniform_format(plan: tuple[int, ...], lo: int, hi: int) -> int | None:
    """The one format a plan gives every row count in lo..hi, or None when it changes inside."""
    formats, start = set(), 1
    for i in range(0, len(plan), 2):
        if plan[i] >= lo and start <= hi:
            formats.add(plan[i + 1])
        start = plan[i] + 1
    return formats.pop() if len(formats) == 1 else None


def linear_kernel(x, w, bias, int4_packed, int4_scales, int8_q, int8_scales, plan, out_features):
    fmt = format_for(plan, x.shape[0])
    return format_kernel(fmt, x, w, bias, int4_packed, int4_scales, int8_q, int8_scales)


def format_kernel(fmt, x, w, bias, int4_packed, int4_scales, int8_q, int8_scales):
    """x times the weight in format fmt (no row count read: traceable with symbolic rows)."""
    if fmt == DENSE:
        if w.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")
        return F.linear(x, w, bias)
    if fmt == INVARIANT:
        return invariant_matmul.matmul(x, w, bias)
    if fmt == INT4:  # the kernel takes bf16 activations
        y = int4_weight.matmul(x.to(torch.bfloat16), int4_packed, int4_scales).to(x.dtype)
    elif fmt == INT8:
        y = int8_weight.matmul_weight_only(x, int8_q, int8_scales)
    else:
        y = int8_weight.matmul_dynamic(x, int8_q, int8_scales)
    return y if bias is None else y + bias


def run_format(fmt: int, x: torch.Tensor, args: tuple) -> torch.Tensor:
    """One format of a Linear's op_args, whatever its plan (weight_plan.py's measurement, the
    compiled buckets' traced_format)."""
    return format_kernel(fmt, x, *args[:6])


def _linear_shape(x, w, bias, int4_packed, int4_scales, int8_q, int8_scales, plan, out_features):
    return x.new_empty((x.shape[0], out_features))


for _key in ("CPU", "MkldnnCPU", "CUDA"):
    _LIB.impl("linear", linear_kernel, _key)
_LIB.impl("linear", _linear_shape, "Meta")

# Set inside invariant_rows(): every Linear reads the invariant plan, whatever its own.
_invariant_step = False


@contextmanager
def invariant_rows():
    """Within it every Linear's op_args give INVARIANT_ONLY: a step that computes prompt KV under
    the default cache-invariant prefill (model_runner.py) reads its weights as the flag does."""
    global _invariant_step
    before, _invariant_step = _invariant_step, True
    try:
        yield
    finally:
        _invariant_step = before


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


@dataclass
class IntCopies:
    """A weight's integer forms, built from its unrounded float32 values (weight_plan.py picks)."""

    int4: Int4Weight | None
    int8: Int8Weight | None

    @classmethod
    def of(cls, weight: torch.Tensor) -> IntCopies:
        return cls(Int4Weight.from_exact(weight), Int8Weight.from_float(weight))


class Linear:
    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        prepack: bool = True,
        copies: IntCopies | None = None,
    ):
        """copies: the same weight's integer forms (read once a plan says so: set_plan)."""
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.int4 = copies.int4 if copies else None
        self.int8 = copies.int8 if copies else None
        self.plan: tuple[int, ...] = DENSE_ONLY
        self.packed = prepack and can_prepack(weight)
        # the plain weight is dropped when packed: the packed copy is the only one kept
        self.weight: torch.Tensor | None = weight
        if self.packed:
            try:
                self.weight = torch.ops.mkldnn._reorder_linear_weight(
                    weight.contiguous(), PACK_BATCH_HINT
                )
            except RuntimeError:  # the op exists but refuses this CPU: the plain path it is
                self.packed = False

    def formats(self) -> set[int]:
        """The formats this Linear holds now."""
        held = {DENSE: self.weight, INT4: self.int4, INT8: self.int8, INT8_DYN: self.int8}
        return {f for f, form in held.items() if form is not None}

    def set_plan(self, plan: tuple[int, ...], keep_dense: bool = False) -> None:
        """Read each row range in its plan's format, where held (else int8, else dense); drop the
        forms no range reads (keep_dense: never the dense weight, which invariant_rows reads)."""
        fallback = INT8 if self.int8 is not None else DENSE
        held = self.formats()
        if DENSE in held:  # the invariant format reads the dense weight
            held.add(INVARIANT)
        self.plan = tuple(v if i % 2 == 0 or v in held else fallback for i, v in enumerate(plan))
        used = set(self.plan[1::2]) | ({INVARIANT} if keep_dense else set())
        if not used & {DENSE, INVARIANT}:
            self.weight = None
        if INT4 not in used:
            self.int4 = None
        if not used & {INT8, INT8_DYN}:
            self.int8 = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in_features] -> [T, out_features]."""
        return linear_kernel(x, *self.op_args())

    def op_args(self) -> tuple:
        """What torch.ops.radixrt.linear takes after x: plain tensors and ints, so a compiled graph
        can take the tensors as inputs (the same graph for every layer)."""
        int4, int8 = self.int4, self.int8
        return (
            self.weight,
            self.bias,
            int4.packed if int4 else None,
            int4.scales_and_zeros if int4 else None,
            int8.qweight if int8 else None,
            int8.scales if int8 else None,
            list(INVARIANT_ONLY if _invariant_step else self.plan),
            self.out_features,
        )

    def numel(self) -> int:
        return self.out_features * self.in_features
