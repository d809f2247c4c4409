"""Triton attention kernels on the GPU: decode bandwidth and extend speed vs torch SDPA.

    python benchmarks/bench_attention_kernels.py [--dtype bf16] [--page-size 16]

Decode (batch 64 x 4k context, and batch 1 x 32k for the split path) is bound by reading the
KV cache, so it is reported as achieved bytes/s over the device's measured copy bandwidth
(a large tensor copy, read + write counted). Extend is compute bound: reported as TFLOP/s and
as a time ratio against torch SDPA on the same data laid out contiguously (SDPA cannot read
the paged pool: it gets that layout for free). Exits with a message where there is no GPU.
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

if not torch.cuda.is_available():
    print(
        "bench_attention_kernels: no CUDA device, nothing to measure (the kernels are tested on CPU "
        "under TRITON_INTERPRET=1 in tests/triton)"
    )
    sys.exit(0)

import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from radixrt.kernels.attention_triton import TritonAttentionBackend  # noqa: E402
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.forward_batch import build_forward_batch  # noqa: E402

DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write)."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300)
    return 2 * src.numel() / (ms * 1e-3)


def build(prefix_lens, extend_lens, hq, hkv, d, page_size, dtype, seed=0):
    """A paged batch with pages scattered at random over a pool of just the needed size."""
    gen = random.Random(seed)
    pages_needed = [-(-(p + e) // page_size) for p, e in zip(prefix_lens, extend_lens)]
    free = list(range(sum(pages_needed)))
    gen.shuffle(free)
    max_context = max(p + e for p, e in zip(prefix_lens, extend_lens))
    req_to_slot = torch.zeros((len(prefix_lens), max_context), dtype=torch.int64, device=DEV)
    items = []
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        pages = [free.pop() for _ in range(pages_needed[i])]
        slots = [pages[j // page_size] * page_size + j % page_size for j in range(p + e)]
        items.append(PlanItem(row=i, new_ids=[1] * e, computed_len=p, slots=slots, write_start=0))
    fb = build_forward_batch(items, req_to_slot, device=DEV)
    num_slots = sum(pages_needed) * page_size
    k_cache = torch.randn(num_slots, hkv, d, device=DEV, dtype=dtype)
    v_cache = torch.randn(num_slots, hkv, d, device=DEV, dtype=dtype)
    t = fb.num_tokens
    q = torch.randn(t, hq, d, device=DEV, dtype=dtype)
    k = torch.randn(t, hkv, d, device=DEV, dtype=dtype)
    v = torch.randn(t, hkv, d, device=DEV, dtype=dtype)
    return fb, q, k, v, k_cache, v_cache


def bench_decode(batch, ctx, heads, page_size, dtype, copy_bw):
    hq, hkv, d = heads
    fb, q, k, v, k_cache, v_cache = build(
        [ctx - 1] * batch, [1] * batch, hq, hkv, d, page_size, dtype
    )
    backend = TritonAttentionBackend(hq, hkv, d)
    meta_ms = do_bench(lambda: backend.init_forward_metadata(fb), warmup=10, rep=100)
    backend.init_forward_metadata(fb)
    ms = do_bench(
        lambda: backend.forward(q, k, v, k_cache, v_cache, fb, d**-0.5), warmup=25, rep=200
    )
    esize = q.element_size()
    meta = fb.attn_meta
    # KV read + slot indices + q/out + split partials written and read back (fp32)
    kv_bytes = 2 * batch * ctx * hkv * d * esize
    moved = (
        kv_bytes
        + batch * ctx * 8
        + 2 * batch * hq * d * esize
        + 2 * meta.part_out.numel() * 4
        + 2 * meta.part_lse.numel() * 4
    )
    bw = moved / (ms * 1e-3)
    print(
        f"decode  B={batch:<3} ctx={ctx:<6} heads={hq}/{hkv} d={d} page={page_size} splits<= {meta.max_splits:<2} "
        f"{ms * 1e3:8.1f} us  {bw / 1e9:7.0f} GB/s  {bw / copy_bw:5.1%} of copy  (metadata {meta_ms * 1e3:.0f} us)"
    )


def sdpa_extend(qs, ks, vs, prefix_len):
    """SDPA on contiguous [B, H, L, D]; GQA by expanding KV heads (what the data would need anyway)."""
    if prefix_len == 0:
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    n, total = qs.shape[2], ks.shape[2]
    mask = (
        torch.arange(total, device=DEV)[None, :]
        <= (prefix_len + torch.arange(n, device=DEV))[:, None]
    )
    return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)


def bench_extend(batch, prefix_len, extend_len, heads, page_size, dtype):
    hq, hkv, d = heads
    fb, q, k, v, k_cache, v_cache = build(
        [prefix_len] * batch, [extend_len] * batch, hq, hkv, d, page_size, dtype
    )
    backend = TritonAttentionBackend(hq, hkv, d)
    backend.init_forward_metadata(fb)
    scale = d**-0.5
    out = backend.forward(q, k, v, k_cache, v_cache, fb, scale)
    ms = do_bench(lambda: backend.forward(q, k, v, k_cache, v_cache, fb, scale), warmup=10, rep=100)
    # the same data contiguous, KV heads expanded for SDPA
    seq = prefix_len + extend_len
    slots = fb.req_to_slot[:batch, :seq]  # [B, L]
    # [B, Hq, L, D]
    ks = k_cache[slots].repeat_interleave(hq // hkv, 2).transpose(1, 2).contiguous()
    vs = v_cache[slots].repeat_interleave(hq // hkv, 2).transpose(1, 2).contiguous()
    qs = q.view(batch, extend_len, hq, d).transpose(1, 2).contiguous()  # [B, Hq, n, D]
    ref = sdpa_extend(qs, ks, vs, prefix_len)
    err = (
        (out.view(batch, extend_len, hq, d).transpose(1, 2).float() - ref.float())
        .abs()
        .max()
        .item()
    )
    sdpa_ms = do_bench(lambda: sdpa_extend(qs, ks, vs, prefix_len), warmup=10, rep=100)
    # QK^T and PV over the visible (prefix + causal) pairs
    pairs = batch * (extend_len * prefix_len + extend_len * (extend_len + 1) / 2)
    flops = 4 * pairs * hq * d
    print(
        f"extend  B={batch:<3} prefix={prefix_len:<5} new={extend_len:<5} heads={hq}/{hkv} d={d} page={page_size} "
        f"{ms * 1e3:8.1f} us  {flops / ms / 1e9:6.1f} TFLOP/s  SDPA {sdpa_ms * 1e3:8.1f} us  "
        f"triton/SDPA time {ms / sdpa_ms:4.2f}x  max|diff| {err:.1e}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()
    dtype, ps = DTYPES[args.dtype], args.page_size
    print(
        f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
        f"dtype {args.dtype}"
    )
    copy_bw = copy_bandwidth()
    print(f"measured copy bandwidth: {copy_bw / 1e9:.0f} GB/s (read + write)")
    for heads in [(32, 8, 128), (9, 3, 64)]:
        bench_decode(64, 4096, heads, ps, dtype, copy_bw)
        bench_decode(1, 32768, heads, ps, dtype, copy_bw)
        bench_decode(256, 1024, heads, ps, dtype, copy_bw)
    for heads in [(32, 8, 128), (9, 3, 64)]:
        bench_extend(4, 0, 2048, heads, ps, dtype)
        bench_extend(4, 2048, 512, heads, ps, dtype)
        bench_extend(1, 0, 8192, heads, ps, dtype)


if __name__ == "__main__":
    main()
