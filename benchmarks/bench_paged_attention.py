"""The whole-step graph's decode attention, compiled by Inductor as the graph compiles it: the pages
read in place (models/llama_step.paged_attention, the current form) against a gathered copy of each
request's pages with the newest key put in and the CPU flash kernel (the form before it), side by
side in one run, per layer call, SmolLM2's heads (9 q heads over 3 kv heads of 64), bf16 pool.

    python benchmarks/bench_paged_attention.py [--cases 1x560,1x2048,16x600,32x600]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from radixrt.runtime.model.models.llama_layer import LayerDims
from radixrt.runtime.model.models.llama_step import paged_attention

HQ, HKV, DIM, SLOTS = 9, 3, 64, 40_000
D = LayerDims(HQ, HKV, DIM, 1536, 1e-5, torch.bfloat16, torch.float32, torch.bfloat16)


def gathered(q, k, v, k_pool, v_pool, kv_idx, own_lens):
    """The form before: each request's pages gathered, the newest k/v put in, the flash kernel."""
    b, width = kv_idx.shape
    visible = torch.arange(width)[None, :] < own_lens[:, None]
    mask = torch.zeros((b, 1, 1, width), dtype=q.dtype).masked_fill(
        ~visible[:, None, None, :], float("-inf")
    )
    newest = (torch.arange(b), own_lens - 1)
    keys = k_pool[kv_idx].index_put(newest, k).transpose(1, 2)
    values = v_pool[kv_idx].index_put(newest, v).transpose(1, 2)
    qg = q.reshape(b, HKV, HQ // HKV, DIM)
    return F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=DIM**-0.5)


def in_place(q, k, v, k_pool, v_pool, kv_idx, own_lens):
    visible = torch.arange(kv_idx.shape[1])[None, :] < own_lens[:, None] - 1
    out, _ = paged_attention(D, DIM**-0.5, q, k, v, k_pool, v_pool, kv_idx, visible)
    return out.to(q.dtype)


def per_call(fn, args, iters: int) -> float:
    for _ in range(5):
        fn(*args)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1x560,1x2048,16x600,32x600")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    torch.manual_seed(0)
    dt = torch.bfloat16
    k_pool, v_pool = torch.randn(SLOTS, HKV, DIM, dtype=dt), torch.randn(SLOTS, HKV, DIM, dtype=dt)
    forms = {"gathered": torch.compile(gathered), "in place": torch.compile(in_place)}
    print(
        f"{'rows x keys':>12} {'gathered us':>12} {'in place us':>12} {'speed-up':>9} {'max diff':>9}"
    )
    for case in args.cases.split(","):
        b, width = map(int, case.split("x"))
        kv_idx = torch.stack([torch.randperm(SLOTS)[:width] for _ in range(b)])
        own_lens = torch.full((b,), width)
        q = torch.randn(b, HQ, DIM, dtype=dt)
        k, v = torch.randn(b, HKV, DIM, dtype=dt), torch.randn(b, HKV, DIM, dtype=dt)
        inputs = (q, k, v, k_pool, v_pool, kv_idx, own_lens)
        diff = (forms["gathered"](*inputs).float() - forms["in place"](*inputs).float()).abs().max()
        t = {name: per_call(fn, inputs, args.iters) for name, fn in forms.items()}
        t2 = {name: per_call(fn, inputs, args.iters) for name, fn in forms.items()}  # interleaved
        t = {name: min(t[name], t2[name]) for name in t}
        print(f"{case:>12} {t['gathered'] * 1e6:12.1f} {t['in place'] * 1e6:12.1f} "
              f"{t['gathered'] / t['in place']:8.2f}x {diff.item():9.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
