"""tests/gguf_quantize.py against an independent truth: gguf-py's own dequantizers, which decode
the block layouts as llama.cpp defines them. A K-quant block written with a misplaced bit, nibble
or sub-block scale decodes to values far from the input, so a round trip within the format's
resolution checks the layout as well as the rounding."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES
from gguf_quantize import quantize

# qtype: (sub-block size, super-block size, f, g, h). Every element may be off by at most
# f * max|x| of its sub-block + g * max|x| of its super-block + h:
# - f is half a code step over a sub-block spanning [-amax, amax] (Q4_0: a full step, since its
#   scale maps the largest magnitude to -8 and the opposite sign clips at +7);
# - g covers the float16 block scales (legacy types) and, for K-quants, the 6-bit (Q6_K: 8-bit)
#   grid of the sub-block scales and mins, whose unit is set by the largest sub-block;
# - h is the float16 scale's absolute resolution for tiny blocks (subnormal spacing 2**-24): the
#   gguf-py encoders round the scale to nearest and keep their codes, so its error is multiplied
#   by the largest code; the K-quant encoders recompute codes from the stored scale, so only
#   about half a spacing remains.
BOUNDS = {
    QT.Q8_0: (32, 32, 1 / 254, 1e-3, 128 * 2**-25),
    QT.Q4_0: (32, 32, 1 / 8, 1e-3, 9 * 2**-25),
    QT.Q4_1: (32, 32, 1 / 15, 1e-3, 16 * 2**-25),
    QT.Q4_K: (32, 256, 1 / 15, 1 / 100, 2**-24),
    QT.Q5_K: (32, 256, 1 / 31, 1 / 100, 2**-24),
    QT.Q6_K: (16, 256, 1 / 62, 1 / 1000, 2**-24),
}
TYPES = list(BOUNDS)


def special_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows that break naive encoders: constants (zero range), zeros (zero scale), one-signed rows
    (the K-quant min is clamped to <= 0) and rows whose sub-blocks differ in magnitude by 1000x
    (small sub-blocks on a coarse super-block scale grid)."""
    rows = [
        np.full(n, 0.75),
        np.full(n, -1.25),
        np.zeros(n),
        -np.abs(rng.standard_normal(n)) - 0.5,
        np.abs(rng.standard_normal(n)) + 2.0,
        rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-3, 0, n // 16), 16),
        np.where(np.arange(n) % 256 == 7, 5.0, 1e-4 * rng.standard_normal(n)),
    ]
    return np.stack(rows).astype(np.float32)


def round_trip_excess(x: np.ndarray, qtype: QT) -> tuple[float, float]:
    """(worst error / its bound, worst error / max|x| of its sub-block) over the matrix: the first
    is what the tests check (<= 1), the second the figure the module's report quotes."""
    sub, sup, f, g, h = BOUNDS[qtype]
    y = quants.dequantize(quantize(x, qtype), qtype)
    assert y.shape == x.shape and y.dtype == np.float32
    err = np.abs(y - x).reshape(-1, sup // sub, sub).max(axis=-1)
    amax_sub = np.abs(x).reshape(-1, sup // sub, sub).max(axis=-1)
    amax_sup = amax_sub.max(axis=-1, keepdims=True)
    bound = f * amax_sub + g * amax_sup + h
    rel = err / np.where(amax_sub == 0, 1, amax_sub)
    return float((err / bound).max()), float(rel.max())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(3, 256), (64, 512), (2, 5, 768)])
def test_random_matrix_round_trips_within_the_formats_resolution(qtype, shape):
    """Rows of different scales, 3-D included: GGUF tensors are written as (..., row) matrices."""
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.uniform(0.01, 3.0, (*shape[:-1], 1))).astype(np.float32)
    ratio, _ = round_trip_excess(x, qtype)
    assert ratio <= 1.0


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [256, 512])
def test_special_rows_round_trip_within_the_formats_resolution(qtype, n):
    """One- and two-super-block rows of the shapes that break naive min/max and absmax encoders."""
    x = special_rows(n, np.random.default_rng(n))
    ratio, _ = round_trip_excess(x, qtype)
    assert ratio <= 1.0


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_constant_and_zero_rows_come_back_nearly_exact(qtype):
    """A zero row must decode to exact zeros and a constant row to (nearly) itself: the encoder's
    zero-scale guards must not leave NaN or garbage codes behind."""
    x = np.stack([np.zeros(512), np.full(512, 0.5), np.full(512, -2.0)]).astype(np.float32)
    y = quants.dequantize(quantize(x, qtype), qtype)
    assert np.isfinite(y).all()
    assert (y[0] == 0).all()
    _, _, f, g, _ = BOUNDS[qtype]
    assert np.abs(y[1:] - x[1:]).max() <= (f + g) * 2.0


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(3, 256), (64, 512), (2, 5, 768), (1024,)])
def test_bytes_per_row_match_ggml_quant_sizes(qtype, shape):
    """gguf's writer and every reader size a tensor's data from GGML_QUANT_SIZES alone."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    q = quantize(np.ones(shape, dtype=np.float32), qtype)
    assert q.dtype == np.uint8
    assert q.shape == (*shape[:-1], shape[-1] // block_size * type_size)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda t: t.name)
def test_k_quant_rejects_rows_that_are_not_whole_super_blocks(qtype):
    """A partial super-block has no encoding: better a clear error than a silently short row."""
    with pytest.raises(ValueError):
        quantize(np.ones((2, 128), dtype=np.float32), qtype)


def test_types_without_an_encoder_are_refused():
    """A test asking for an unsupported type must fail loudly, as gguf.quants.quantize does."""
    with pytest.raises(NotImplementedError):
        quantize(np.ones((1, 256), dtype=np.float32), QT.IQ2_XXS)
