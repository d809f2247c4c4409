"""4-bit copies of exactly-4-bit weights (model/int4_weight.py) against an independent truth: the codes
are rebuilt into the float32 weight, the kernel's product is compared with x @ W^T in float32, and
Linear reads the copy for the row counts its plan gives it."""

import pytest
import torch

from radixrt.runtime.model import int4_weight
from radixrt.runtime.model.int4_weight import GROUP, Int4Weight
from radixrt.runtime.model.linear import DENSE, INT4, MAX_ROWS, IntCopies, Linear

pytestmark = pytest.mark.skipif(
    not int4_weight.available(), reason="this torch has no CPU int4 kernel"
)


def q4_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A Q4_1-style weight: every group of GROUP values along K is q * d + m with q in 0..15, the min and
    max of each group present (as llama.cpp's quantizer makes them), d and m float16 values."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    codes[..., 0], codes[..., 1] = 0, 15
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.05 + 0.001).half().float()
    m = (-8 * d + torch.randn(n, k // GROUP, 1, generator=g) * 0.01).half().float()
    return (codes * d + m).reshape(n, k)


def test_exact_four_bit_weight_gets_a_copy_that_multiplies_like_it():
    w = q4_weight(96, 4 * GROUP)
    int4 = Int4Weight.from_exact(w)
    assert int4 is not None
    x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(3)).bfloat16()
    expected = x.float() @ w.t()
    got = int4(x).float()
    assert got.dtype == torch.float32 and got.shape == expected.shape
    # bf16 output and bf16 scales: a few parts in a thousand of the output's scale
    torch.testing.assert_close(got, expected, atol=0.01 * float(expected.abs().max()), rtol=0.02)


def test_weights_that_are_not_four_bit_groups_get_none():
    w = q4_weight(32, 2 * GROUP)
    w[5, 7] += 1e-3  # one value off the grid of its group
    assert Int4Weight.from_exact(w) is None
    assert Int4Weight.from_exact(torch.randn(16, 64)) is None  # a trained float weight
    # K not a multiple of the group
    assert Int4Weight.from_exact(torch.randn(16, GROUP + 1)) is None


def test_linear_reads_the_copy_where_its_plan_says(monkeypatch):
    w = q4_weight(64, 2 * GROUP, seed=1)
    lin = Linear(w.bfloat16(), copies=IntCopies.of(w))
    lin.set_plan((4, INT4, MAX_ROWS, DENSE))
    calls = []
    # the 4-bit kernel, as Linear (and the compiled graphs' op) call it
    real = torch._weight_int4pack_mm_for_cpu
    monkeypatch.setattr(
        torch, "_weight_int4pack_mm_for_cpu", lambda x, *a: calls.append(x.shape[0]) or real(x, *a)
    )
    for rows in (1, 4, 5, 64):
        # seeded: bf16 rounding against the tolerance is then the same every run
        x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows)).bfloat16()
        out = lin(x).float()
        torch.testing.assert_close(
            out, x.float() @ w.t(), atol=0.02 * float(out.abs().max()), rtol=0.02
        )
    assert calls == [1, 4]
    # a float32 model reads it too (its activations rounded to bf16 for the kernel)
    lin32 = Linear(w, copies=IntCopies.of(w))
    lin32.set_plan((MAX_ROWS, INT4))
    x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(9))
    out = lin32(x)
    assert out.dtype == torch.float32 and lin32.weight is None
    torch.testing.assert_close(out, x @ w.t(), atol=0.02 * float(out.abs().max()), rtol=0.02)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_gguf_four_bit_types_get_copies_and_the_others_none(qtype):
    """Q4_0's groups ((q - 8) d, the top code often unused) and Q4_K's sub-blocks (6-bit scales and
    mins) are 4-bit grids even where a group skips its lowest or highest code; wider types are not.
    The truth: gguf's own decoder of the quantised matrix, multiplied in float32."""
    import gguf
    from gguf_quantize import quantize

    t = gguf.GGMLQuantizationType[qtype]
    w = torch.from_numpy(
        gguf.quants.dequantize(quantize(torch.randn(48, 512).numpy(), t), t)
    ).float()
    int4 = Int4Weight.from_exact(w)
    if qtype not in ("Q4_0", "Q4_1", "Q4_K"):
        assert int4 is None
        return
    assert int4 is not None
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(5)).bfloat16()
    expected = x.float() @ w.t()
    torch.testing.assert_close(
        int4(x).float(), expected, atol=0.01 * float(expected.abs().max()), rtol=0.02
    )


def test_every_compiled_bucket_of_an_int4_plan_runs_and_multiplies_like_the_weight(tmp_path):
    """A plan reading int4 at every row count (an AVX2 machine's: its int8 kernel is slow)
    compiles each bucket's matmuls as the whole-step graph does (llama_layer.linear with the
    bucket's dims; in a bucket of many row counts each layer is a region, torch's invoke_subgraph,
    traced with symbolic rows), and each runs at the bucket's row counts. Traced into a region,
    torch 2.13's int4 kernel fails when run ("group size must be a scalar"): a compiled engine
    could not start on such a plan."""
    from radixrt.runtime.model.compiled_layers import CompiledLayers, load_or_compile
    from radixrt.runtime.model.layer_tracing import trace_dims
    from radixrt.runtime.model.models import llama_layer, llama_step

    w = q4_weight(64, 2 * GROUP, seed=3)
    lin = Linear(w.bfloat16(), copies=IntCopies.of(w))
    lin.set_plan((MAX_ROWS, INT4))
    args = lin.op_args()
    weights = [a for a in args if isinstance(a, torch.Tensor)]
    dims = llama_layer.LayerDims(1, 1, 8, 8, 1e-5, torch.bfloat16, torch.float32, torch.float32)
    layers = CompiledLayers(dims, 4, tmp_path, (MAX_ROWS, INT4))

    def layer(bucket, x, *tensors):  # as llama_step.decode_step: a region where not static
        it = iter(tensors)
        op_args = tuple(next(it) if isinstance(a, torch.Tensor) else a for a in args)
        d = layers.dims_of(bucket)
        return (
            llama_step._region(
                not bucket.static,
                lambda h, *a: (llama_layer.linear(d, h, a),),
                "lin",
                (x, *op_args),
            ),
        )

    for bucket in layers.buckets[:2]:  # one token, small batches
        rows = [bucket.min_tokens, min(bucket.max_tokens, 4)]
        examples = [torch.zeros(3 if rows[1] > 1 else 1, 64, dtype=torch.bfloat16), *weights]
        dyn = [() if bucket.static else (0,)] + [()] * len(weights)
        traced = trace_dims(lambda *t, b=bucket: layer(b, *t), examples, dyn)
        fn, _, _ = load_or_compile(
            tmp_path / bucket.name.replace(" ", "-"),
            lambda g=traced, e=examples: (g, e),
            static=bucket.static,
        )
        for n in sorted(set(rows)):
            x = torch.randn(n, 64, generator=torch.Generator().manual_seed(n))
            out = fn(x.bfloat16(), *weights)
            out = (out[0] if isinstance(out, (list, tuple)) else out).float()
            want = x.bfloat16().float() @ w.t()
            torch.testing.assert_close(out, want, atol=0.02 * float(out.abs().max()), rtol=0.02)
