"""Quantised KV pool (kernels/kv_quant.py) and the torch backend reading it.

Truths: the round trip of each format within its own error bound (int8: half a step of the row's scale;
fp8 e4m3: 3 mantissa bits, so 1/16 of the value, or the format's smallest step near zero); the torch backend
over a quantised pool equals reference_attention (attention_reference.py, no paging tricks) over the
dequantised pool to float rounding, and stays near attention over the unquantised values.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import make_case

from radixrt.kernels.attention_reference import reference_attention
from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.kernels.kv_quant import KV_CACHE_DTYPES, LayerKV, dequantize, quantize

DTYPES = list(KV_CACHE_DTYPES.values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_within_the_format_bound(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 3, 64) * torch.logspace(-3, 2, 64)[:, None, None]  # rows over five decades
    x[5] = 0.0  # an all-zero row
    q, scale = quantize(x, dtype)
    assert q.dtype == dtype and scale.shape == x.shape[:2] and (scale > 0).all()
    back = dequantize(q, scale, torch.float32)
    err = (back - x).abs()
    if dtype == torch.int8:
        bound = scale[..., None] / 2 + 1e-6 * x.abs()
    else:
        bound = x.abs() / 16 + scale[..., None] * 2.0**-9
    assert (err <= bound).all(), (err - bound).max()
    assert torch.equal(back[5], torch.zeros_like(back[5]))
    # every row uses its range: its largest element maps to the format's largest value
    assert torch.allclose(
        q.float().abs().amax(-1)[x.abs().amax(-1) > 0],
        torch.tensor(127.0 if dtype == torch.int8 else 448.0),
    )


def quantized_case(dtype, compute, seed, **kw):
    fb, q, k, v, k_cache, v_cache = make_case(dtype=compute, seed=seed, **kw)
    kq, ks = quantize(k_cache, dtype)
    vq, vs = quantize(v_cache, dtype)
    return fb, q, k, v, (kq, ks), (vq, vs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [([17, 0, 33], [1, 9, 1]), ([40, 40], [1, 1]), ([0, 12], [7, 5])])
def test_torch_backend_reads_a_quantized_pool(dtype, lens):
    prefix_lens, extend_lens = lens
    decode_first = sorted(zip(prefix_lens, extend_lens), key=lambda pe: pe[1] != 1)
    prefix_lens, extend_lens = [p for p, _ in decode_first], [e for _, e in decode_first]
    fb, q, k, v, (kq, ks), (vq, vs) = quantized_case(
        dtype,
        torch.float32,
        3,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=32,
        page_size=2,
    )
    unquantized_k, unquantized_v = (
        dequantize(kq, ks, torch.float32),
        dequantize(vq, vs, torch.float32),
    )
    backend = TorchAttentionBackend(4, 2, 32)
    backend.init_forward_metadata(fb)
    scale = 32**-0.5
    out = backend.forward(q, k, v, kq, vq, fb, scale, ks, vs)
    # what the pool holds now, dequantised: the reference attends over exactly these values
    pool_k = LayerKV(kq, ks).rows(0, kq.shape[0], torch.float32)
    pool_v = LayerKV(vq, vs).rows(0, vq.shape[0], torch.float32)
    new_k, _ = quantize(k, dtype)
    assert torch.equal(kq[fb.out_slots], new_k), "new K not quantised into out_slots"
    expected = reference_attention(q, pool_k, pool_v, fb, scale)
    # the extend of a fresh prompt attends to its own K/V unquantised, as written: allow that difference
    torch.testing.assert_close(out, expected, atol=0.08 if dtype != torch.int8 else 0.02, rtol=0.05)
    exact = unquantized_k.clone(), unquantized_v.clone()
    exact[0][fb.out_slots], exact[1][fb.out_slots] = k, v
    near = reference_attention(q, *exact, fb, scale)
    torch.testing.assert_close(out, near, atol=0.1 if dtype != torch.int8 else 0.03, rtol=0.05)
