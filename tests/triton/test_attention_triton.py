"""Triton attention kernels (interpreted on CPU) against the per-request torch reference.

Every case builds a real ForwardBatch over randomly placed pages (so slots are arbitrary),
runs TritonAttentionBackend, and compares the output with reference_attention on the cache
the test itself updated. Shapes are small: the interpreter runs each program in Python.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from attention_cases import check_against_reference, make_case

from radixrt.kernels.attention_reference import reference_attention
from radixrt.kernels.attention_triton import TritonAttentionBackend, plan_decode_splits

TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (8e-3, 1.6e-2),
}  # (atol, rtol)


def run_and_check(
    prefix_lens, extend_lens, hq, hkv, d, page_size, dtype, seed=0, backend_kwargs=None, **kw
):
    case = make_case(prefix_lens, extend_lens, hq, hkv, d, page_size, dtype, seed, **kw)
    # reference and kernel each round once to dtype: allow ~2 ulps of it
    check_against_reference(
        TritonAttentionBackend(hq, hkv, d, **(backend_kwargs or {})), case, *TOL[dtype]
    )
    return case[0]


MHA, GQA3, GQA4 = (2, 2, 64), (9, 3, 64), (8, 2, 128)  # MHA, SmolLM2's 3:1 GQA, 4:1 at head_dim 128
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
FORCE_SPLITS = dict(min_split_len=16, target_programs=64, max_kv_splits=8)


def cases(*combos):
    """Hand-picked (heads, page_size, dtype) combos: every value of each axis, not the full product."""
    return pytest.mark.parametrize(
        "heads,page_size,dtype",
        combos,
        ids=[f"h{h[0]}x{h[1]}d{h[2]}-p{p}-{str(d)[6:]}" for h, p, d in combos],
    )


@cases(
    (MHA, 1, F32),
    (MHA, 16, BF16),
    (MHA, 16, F16),
    (GQA3, 16, F32),
    (GQA3, 1, BF16),
    (GQA3, 1, F16),
    (GQA4, 1, F32),
    (GQA4, 16, BF16),
    (GQA4, 1, F16),
)
def test_decode(heads, page_size, dtype):
    # contexts 2 (first decode after a one-token prompt) .. 70, one split each at default settings
    fb = run_and_check([1, 16, 33, 69], [1] * 4, *heads, page_size, dtype, seed=page_size)
    assert fb.num_decode == 4 and fb.attn_meta.max_splits == 1


@cases((GQA3, 1, F32), (GQA3, 16, BF16), (GQA4, 16, F32), (GQA4, 1, F16))
def test_decode_split_kv(heads, page_size, dtype):
    # very different lengths; the long ones are split across several programs and merged by LSE
    fb = run_and_check(
        [3, 150, 47, 200], [1] * 4, *heads, page_size, dtype, seed=7, backend_kwargs=FORCE_SPLITS
    )
    splits = fb.attn_meta.num_splits.tolist()
    assert splits[0] == 1 and max(splits) > 2, splits


@cases(
    (MHA, 1, F32),
    (MHA, 16, F16),
    (GQA3, 16, F32),
    (GQA3, 1, BF16),
    (GQA4, 16, BF16),
    (GQA4, 1, F16),
)
def test_extend(heads, page_size, dtype):
    # empty prefix + single-token prompt, empty prefix + long, page-aligned prefix, odd everything
    run_and_check(
        [0, 0, 16, 21, 3], [1, 37, 18, 5, 20], *heads, page_size, dtype, seed=11 + page_size
    )


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_shared_prefix_pages(page_size):
    # several requests read the same (radix-cached) prefix slots
    run_and_check(
        [32, 32, 40], [3, 17, 9], 9, 3, 64, page_size, torch.float32, seed=3, share_prefix=True
    )


@cases((MHA, 16, F16), (GQA3, 1, F32), (GQA4, 16, BF16))
def test_mixed_decode_and_extend(heads, page_size, dtype):
    # decodes (one split and several) followed by chunked-prefill-like extends in one forward
    fb = run_and_check(
        [90, 1, 7, 0, 40, 64],
        [1, 1, 1, 23, 1, 16],
        *heads,
        page_size,
        dtype,
        seed=5,
        backend_kwargs=FORCE_SPLITS,
    )
    # the 1-token extend after a 0-prefix extend stays an extend
    assert fb.num_decode == 3 and fb.attn_meta.num_extend == 3


def test_metadata_is_per_forward_and_reused_across_layers():
    # two "layers" share one init_forward_metadata; each stores into its own cache
    fb, q, k, v, k_cache, v_cache = make_case([20, 0], [1, 9], 4, 2, 64, 1, torch.float32, seed=2)
    backend = TritonAttentionBackend(4, 2, 64)
    backend.init_forward_metadata(fb)
    meta = fb.attn_meta
    out0 = backend.forward(q, k, v, k_cache, v_cache, fb, 0.125)
    k1, v1 = k_cache.clone(), v_cache.clone()
    out1 = backend.forward(q * 2, k, v, k1, v1, fb, 0.125)
    assert fb.attn_meta is meta
    assert torch.allclose(out0, reference_attention(q, k_cache, v_cache, fb, 0.125), atol=1e-4)
    assert torch.allclose(out1, reference_attention(q * 2, k1, v1, fb, 0.125), atol=1e-4)


def test_plan_decode_splits_balances_and_never_leaves_a_split_empty():
    lens = [1, 2, 16, 17, 100, 1000, 4096, 5]
    splits, chunks = plan_decode_splits(
        lens, num_kv_heads=2, target_programs=64, max_splits=8, min_split_len=16, align=16
    )
    for seq_len, n, c in zip(lens, splits, chunks):
        assert 1 <= n <= 8 and c % 16 == 0 and c * (n - 1) < seq_len <= c * n
    assert splits[lens.index(4096)] == 8 and splits[0] == 1
    # a big batch of long requests fills the device without splitting
    splits, _ = plan_decode_splits([4096] * 64, 8, 528, 16, 128, 64)
    assert splits == [1] * 64


def test_bad_head_config_is_value_error():
    with pytest.raises(ValueError, match="multiple"):
        TritonAttentionBackend(9, 2, 64)
    with pytest.raises(ValueError, match="head_dim"):
        TritonAttentionBackend(2, 2, 8)


COMPILE_FOR_HOPPER = """
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from radixrt.kernels import triton_decode, triton_extend
from radixrt.kernels.attention_triton import TritonAttentionBackend, extend_launch_config

dtype, head_dim = getattr(torch, sys.argv[1]), int(sys.argv[2])
elem = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
precision = "ieee" if dtype == torch.float32 else "tf32"
int_ptrs = {"kv_indptr", "kv_indices", "chunk_lens", "num_splits", "qo_indptr", "prefix_indptr", "prefix_indices"}

def compile_kernel(fn, constexprs, num_warps, num_stages, cache="*" + elem):
    sig = {n: "constexpr" if n in constexprs else "i32" if n.startswith("stride_") or n == "window"
           else "fp32" if n in ("sm_scale_log2", "cap_log2") else "*i64" if n in int_ptrs
           else "*fp32" if n.startswith("Part_") or n.endswith("_scale")
           else cache if n in ("K_cache", "V_cache") else "*" + elem
           for n in fn.arg_names}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    assert k.asm["cubin"] and k.metadata.shared <= 227 * 1024, k.metadata.shared
    print(fn.__name__, "shared", k.metadata.shared)

backend = TritonAttentionBackend(8, 2, head_dim)  # group 4
common = dict(HEAD_DIM=head_dim, BLOCK_D=backend.block_d, GROUP=4, DOT_FP32=False, PRECISION=precision, QUANT=False)
decode1 = dict(common, BLOCK_H=backend.block_h, BLOCK_N=backend.decode_block_n)
compile_kernel(triton_decode._decode_stage1, decode1, 4, 2)
compile_kernel(triton_decode._decode_stage2, dict(HEAD_DIM=head_dim, BLOCK_D=backend.block_d, BLOCK_S=8), 4, 1)
bm, bn, warps, stages = extend_launch_config(head_dim, dtype, (9, 0))
compile_kernel(triton_extend._extend_kernel, dict(common, BLOCK_M=bm, BLOCK_N=bn), warps, stages)
# an int8 pool (kv_quant.py): the same kernels reading int8 rows and float32 scales
compile_kernel(triton_decode._decode_stage1, dict(decode1, QUANT=True), 4, 2, cache="*i8")
compile_kernel(triton_extend._extend_kernel, dict(common, BLOCK_M=bm, BLOCK_N=bn, QUANT=True), warps, stages, cache="*i8")
"""


def test_kernels_compile_for_hopper(dtype="bfloat16", head_dim=128):
    # The interpreter accepts what the compiler rejects (non-constexpr globals, dot shapes, shared
    # memory): compile each kernel to a sm_90 cubin with the backend's GPU launch settings. No GPU
    # needed, but a fresh process: triton's own jit helpers are interpreted once TRITON_INTERPRET is set.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_HOPPER, dtype, str(head_dim)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("shared") == 5, res.stdout


def test_tiny_llama_with_triton_backend_matches_hf(tiny_llama_config, paged_driver):
    """The backend inside the real model forward (as model_runner wires attention_backend="triton"):
    teacher-forced logits of a random tiny Llama equal HF's through prefill chunks, decodes beside
    extends and a single-token prompt, on scattered pages of size 4."""
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.model.models.llama import LlamaForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(
        tiny_llama_config, attn_implementation="eager", dtype=F32
    ).eval()
    with torch.no_grad():  # away from init values so attention is not near-uniform
        for name, p in hf.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.15)
    ours = LlamaForCausalLM(tiny_llama_config, F32, "cpu")
    ours.load_weights(hf.state_dict())
    attn = TritonAttentionBackend(
        ours.num_q_heads, ours.num_kv_heads, ours.head_dim, min_split_len=8
    )
    seqs = {"a": torch.randint(0, 128, (40,)).tolist(), "b": torch.randint(0, 128, (9,)).tolist()}
    with torch.no_grad():
        expected = {n: hf(torch.tensor([s])).logits[0] for n, s in seqs.items()}
    driver = paged_driver(ours, attn, num_pages=40, page_size=4, seed=1)
    fed = {"a": 0, "b": 0}
    for feeds in (
        [("a", 30)],
        [("a", 1), ("b", 1)],
        [("a", 1), ("b", 5)],
        [("a", 1), ("b", 1)],
        [("b", 1), ("a", 1)],
        [("a", 6), ("b", 1)],
    ):
        out = driver.step([(n, seqs[n][fed[n] : fed[n] + k], False) for n, k in feeds])
        for n, k in feeds:
            fed[n] += k
            torch.testing.assert_close(out[n][0], expected[n][fed[n] - 1], atol=1e-4, rtol=1e-4)
    assert fed == {"a": 40, "b": 9}


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("decode_only", [True, False], ids=["decode", "mixed"])
def test_quantized_pool_matches_the_torch_backend(kv_dtype, dtype, decode_only):
    """A quantised pool (kv_quant.py): the kernels scale each K/V row as they read it. Truth: the torch
    backend over the same pool (tests/unit/test_kv_quant.py holds it to reference_attention), and both leave
    the same quantised rows and scales at out_slots. Decodes read every key from the pool in both: equal to
    rounding. Extends: the kernel reads a chunk's own new keys unquantised, the torch backend's padded path
    reads them back from the pool, so they differ by the format's rounding."""
    from radixrt.kernels.attention_torch import TorchAttentionBackend
    from radixrt.kernels.kv_quant import quantize

    hq, hkv, d = GQA3
    # decodes (two splits for the long one), then extends with and without a cached prefix
    lens = ([5, 90, 33], [1, 1, 1]) if decode_only else ([5, 90, 0, 21], [1, 1, 9, 6])
    fb, q, k, v, k_cache, v_cache = make_case(*lens, hq, hkv, d, 4, dtype, seed=5)
    pools = []
    for _ in range(2):
        (kq, ks), (vq, vs) = quantize(k_cache, kv_dtype), quantize(v_cache, kv_dtype)
        pools.append((kq, vq, ks, vs))
    scale = d**-0.5
    triton_backend = TritonAttentionBackend(hq, hkv, d, **FORCE_SPLITS)
    triton_backend.init_forward_metadata(fb)
    out = triton_backend.forward(
        q, k, v, pools[0][0], pools[0][1], fb, scale, pools[0][2], pools[0][3]
    )
    torch_backend = TorchAttentionBackend(hq, hkv, d)
    fb.attn_meta = None
    torch_backend.init_forward_metadata(fb)
    want = torch_backend.forward(
        q, k, v, pools[1][0], pools[1][1], fb, scale, pools[1][2], pools[1][3]
    )
    for a, b in zip(pools[0], pools[1]):
        assert torch.equal(a.float(), b.float()), "the two backends stored different quantised rows"
    if decode_only:
        torch.testing.assert_close(
            out.float(), want.float(), atol=TOL[dtype][0] * 4 + 1e-4, rtol=TOL[dtype][1] * 2
        )
    else:
        atol = 0.05 if kv_dtype == torch.int8 else 0.2
        torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=0.1)


@pytest.mark.parametrize("window", [1, 5, 40])
@cases((GQA3, 1, F32), (GQA4, 16, BF16), (MHA, 4, F16))
def test_sliding_window(heads, page_size, dtype, window):
    """Sliding-window layers: decodes longer and shorter than the window (split across programs, so whole
    splits fall before the window), and extends with and without a cached prefix, against
    reference_attention with the same window."""
    hq, hkv, d = heads
    case = make_case(
        [3, 150, 47, 0, 21], [1, 1, 1, 30, 12], hq, hkv, d, page_size, dtype, seed=window
    )
    check_against_reference(
        TritonAttentionBackend(hq, hkv, d, **FORCE_SPLITS), case, *TOL[dtype], window=window
    )


@cases((GQA3, 1, F32), (GQA4, 16, BF16))
def test_softcapped_scores(heads, page_size, dtype):
    """Gemma 2's soft-capped scores in both kernels (decodes split across programs, extends with and
    without a cached prefix, one under a sliding window) against reference_attention."""
    hq, hkv, d = heads
    case = make_case([3, 150, 0, 21], [1, 1, 30, 12], hq, hkv, d, page_size, dtype, seed=9)
    backend = TritonAttentionBackend(hq, hkv, d, **FORCE_SPLITS)
    check_against_reference(backend, case, *TOL[dtype], softcap=0.7)
    case = make_case([40, 0], [1, 25], hq, hkv, d, page_size, dtype, seed=10)
    check_against_reference(backend, case, *TOL[dtype], window=9, softcap=0.7)
