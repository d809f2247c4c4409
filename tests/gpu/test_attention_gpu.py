"""Triton attention on the GPU at serving-sized shapes, against the per-request torch reference.

Skipped without CUDA. The kernels are imported only after the skip: triton.jit picks
interpreted-or-compiled at decoration time, and the CPU tier interprets them (tests/triton).
"""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from attention_cases import check_against_reference, make_case  # noqa: E402

from radixrt.kernels.attention_triton import TritonAttentionBackend  # noqa: E402

DEV = "cuda"
# fp32 runs with exact (ieee) dots; 16-bit ones multiply P in the input dtype like every flash kernel
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 5e-3), torch.bfloat16: (1.5e-2, 2e-2)}


def check(prefix_lens, extend_lens, heads, page_size, dtype, seed=0, **backend_kwargs):
    hq, hkv, d = heads
    case = make_case(prefix_lens, extend_lens, hq, hkv, d, page_size, dtype, seed, device=DEV)
    check_against_reference(TritonAttentionBackend(hq, hkv, d, **backend_kwargs), case, *TOL[dtype])
    return case[0]


LLAMA8B, SMOL, MHA128 = (32, 8, 128), (9, 3, 64), (16, 16, 128)
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# every 16-bit combination; fp32 (slow-compiling ieee dots, rarely served) on the default model's shape
DECODE_CASES = [
    (h, p, d) for h in (LLAMA8B, SMOL, MHA128) for p in (1, 16) for d in (BF16, F16)
] + [(SMOL, 1, F32), (SMOL, 16, F32)]
EXTEND_CASES = [(h, p, d) for h in (LLAMA8B, SMOL) for p in (1, 16) for d in (BF16, F16)] + [
    (SMOL, 16, F32)
]


def ids(cases):
    return [f"h{h[0]}x{h[1]}d{h[2]}-p{p}-{str(d)[6:]}" for h, p, d in cases]


@pytest.mark.parametrize("heads,page_size,dtype", DECODE_CASES, ids=ids(DECODE_CASES))
def test_decode_batch(heads, page_size, dtype):
    gen = random.Random(1)
    lens = [gen.randrange(1, 3000) for _ in range(24)] + [1, 4095]
    check(lens, [1] * len(lens), heads, page_size, dtype, seed=page_size)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_decode_small_batch_long_context_is_split(dtype):
    fb = check([9000, 17, 5000], [1, 1, 1], SMOL if dtype == F32 else LLAMA8B, 16, dtype, seed=3)
    assert max(fb.attn_meta.num_splits.tolist()) > 1


@pytest.mark.parametrize("heads,page_size,dtype", EXTEND_CASES, ids=ids(EXTEND_CASES))
def test_extend_with_prefix(heads, page_size, dtype):
    # empty prefix, single-token prompt, long prefix + short extend, chunked-prefill-like
    check([0, 0, 1536, 77, 300, 2048], [700, 1, 5, 1000, 129, 512], heads, page_size, dtype, seed=5)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_mixed(dtype):
    prefix = [4000, 30, 1, 800, 0, 513]
    extend = [1, 1, 1, 1, 300, 64]
    fb = check(prefix, extend, LLAMA8B, 16, dtype, seed=9, min_split_len=64)
    assert fb.num_decode == 4


@pytest.mark.parametrize("window", [1, 256, 4096])
def test_sliding_window(window):
    """Sliding-window layers at serving sizes: decodes split across programs (whole splits before the window)
    and extends with prefixes, against reference_attention with the same window."""
    hq, hkv, d = LLAMA8B
    case = make_case(
        [9000, 17, 0, 1536], [1, 1, 700, 300], hq, hkv, d, 16, BF16, seed=window, device=DEV
    )
    check_against_reference(TritonAttentionBackend(hq, hkv, d), case, *TOL[BF16], window=window)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8_e4m3"])
def test_quantized_pool_decode(kv_dtype):
    """An int8 / fp8 pool on the GPU: decodes (every key read back from the pool) equal reference_attention over
    the dequantised pool, to bf16 rounding."""
    from radixrt.kernels.attention_reference import reference_attention
    from radixrt.kernels.kv_quant import LayerKV, quantize

    hq, hkv, d = LLAMA8B
    fb, q, k, v, k_cache, v_cache = make_case(
        [3000, 17, 900], [1, 1, 1], hq, hkv, d, 16, BF16, seed=2, device=DEV
    )
    (kq, ks), (vq, vs) = quantize(k_cache, kv_dtype), quantize(v_cache, kv_dtype)
    backend = TritonAttentionBackend(hq, hkv, d)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, kq, vq, fb, d**-0.5, ks, vs)
    pool_k = LayerKV(kq, ks).rows(0, kq.shape[0], torch.float32)
    pool_v = LayerKV(vq, vs).rows(0, vq.shape[0], torch.float32)
    want = reference_attention(q.float(), pool_k, pool_v, fb, d**-0.5)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
