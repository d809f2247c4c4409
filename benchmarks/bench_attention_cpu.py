"""CPU torch attention: one layer's attention call, padded path vs cascade over a shared prefix.

    OMP_NUM_THREADS=1 python benchmarks/bench_attention_cpu.py [--repeats 15] [--iters 10] [--dtype bf16]

Times TorchAttentionBackend.forward as the model calls it once per layer (store the new K/V,
gather, attend, and for the cascade the merge) on the project's shared-prefix workload: 16
requests whose first 600 positions are the same pool slots (a radix-cache prefix they all
borrow), then 40 positions of their own; SmolLM2-135M's attention shape (Hq 9, Hkv 3, D 64).
Also: a batch with nothing shared (the cascade is not taken and must cost nothing), short
shared prefixes around the threshold, larger batches, and the extend step that prefills 16
questions after the cached prefix. Columns: padded (cascade off), default (the backend's
thresholds), forced (cascade wherever 32+ positions are shared: shows where the thresholds sit);
"meta" is init_forward_metadata, paid once per forward (30 layers). Times are the best of
--repeats runs of --iters calls, the variants taking turns: on a shared machine the minimum is
the least noisy estimate. The variants' outputs are checked to agree.
"""

from __future__ import annotations

import argparse
import copy
import random
import time

import torch

from radixrt.kernels.attention_torch import TorchAttentionBackend
from radixrt.runtime.core.page_allocator import slots_of
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.model.forward_batch import build_forward_batch

HQ, HKV, D = 9, 3, 64


def build(
    num_reqs: int, shared_len: int, own_len: int, new_len: int, page_size: int, seed: int = 0
):
    """num_reqs requests of shared_len common + own_len own positions, the last new_len of them new this
    step (new_len 1: a decode step). Pages scattered at random over a pool of just the needed size."""
    rng = random.Random(seed)
    pages_of = lambda n: -(-n // page_size)  # noqa: E731
    num_pages = pages_of(shared_len) + num_reqs * pages_of(own_len)
    free = list(range(num_pages))
    rng.shuffle(free)
    common = slots_of([free.pop() for _ in range(pages_of(shared_len))], 0, shared_len, page_size)
    seq_len = shared_len + own_len
    items = []
    for row in range(num_reqs):
        slots = common + slots_of(
            [free.pop() for _ in range(pages_of(own_len))], 0, own_len, page_size
        )
        items.append(
            PlanItem(
                row=row,
                new_ids=[1] * new_len,
                computed_len=seq_len - new_len,
                slots=slots,
                write_start=0,
            )
        )
    fb = build_forward_batch(items, torch.zeros((num_reqs, seq_len), dtype=torch.int64))
    return fb, num_pages * page_size


def best_ms(fns: dict, repeats: int, iters: int) -> dict:
    """Best-of-repeats ms per call of each fn; the fns take turns within every repeat, so a burst of
    load from other processes hits them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / iters * 1e3)
    return best


def run_case(num_reqs, shared_len, own_len, new_len, page_size, dtype, repeats, iters):
    fb, num_slots = build(num_reqs, shared_len, own_len, new_len, page_size)
    g = torch.Generator().manual_seed(0)
    t = fb.num_tokens
    q = torch.randn(t, HQ, D, generator=g).to(dtype)
    k, v = (
        torch.randn(t, HKV, D, generator=g).to(dtype),
        torch.randn(t, HKV, D, generator=g).to(dtype),
    )
    k_cache = torch.randn(num_slots, HKV, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, HKV, D, generator=g).to(dtype)
    variants = {"padded": {"min_shared_len": None}, "default": {}, "forced": {"min_saved_kv": 0}}
    row, metas, layers, outs = {}, {}, {}, []
    for label, kw in variants.items():
        backend = TorchAttentionBackend(HQ, HKV, D, **kw)
        batch = copy.copy(fb)  # each variant keeps its own attn_meta

        def meta(backend=backend, batch=batch):
            batch.attn_meta = None
            backend.init_forward_metadata(batch)

        meta()
        groups = (batch.attn_meta.decode, *batch.attn_meta.extends)
        row[label + "_shared"] = max(
            (gr.shared.kv_len for gr in groups if gr is not None and gr.shared), default=0
        )
        metas[label + "_meta"] = meta
        layers[label] = lambda backend=backend, batch=batch: backend.forward(
            q, k, v, k_cache, v_cache, batch, D**-0.5
        )
        outs.append(layers[label]().float())
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=tol, rtol=tol)
    row.update(best_ms(layers, repeats, iters))
    row.update(best_ms(metas, repeats, max(1, iters // 3)))
    return row


CASES = [  # (label, num_reqs, shared_len, own_len, new_len, page_size)
    ("decode 16 x (600 shared + 40 own)", 16, 600, 40, 1, 1),
    ("  same, page size 16", 16, 600, 40, 1, 16),
    ("decode 16 x 640, nothing shared", 16, 0, 640, 1, 1),
    ("decode 64 x (600 shared + 40 own)", 64, 600, 40, 1, 1),
    ("decode 16 x (2000 shared + 40 own)", 16, 2000, 40, 1, 1),
    ("decode 2 x (64 shared + 40 own)", 2, 64, 40, 1, 1),
    ("decode 2 x (512 shared + 40 own)", 2, 512, 40, 1, 1),
    ("decode 4 x (128 shared + 40 own)", 4, 128, 40, 1, 1),
    ("decode 8 x (64 shared + 40 own)", 8, 64, 40, 1, 1),
    ("decode 16 x (32 shared + 40 own)", 16, 32, 40, 1, 1),
    ("decode 16 x (64 shared + 40 own)", 16, 64, 40, 1, 1),
    ("extend 16 x (600 cached shared + 20 new)", 16, 600, 20, 20, 1),
]


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.dtype}, Hq {HQ} Hkv {HKV} D {D}; "
        f"ms per layer call (best of {args.repeats} x {args.iters}); meta: once per forward"
    )
    print(
        "padded: cascade off; default: the backend's thresholds (S: shared length it took, 0: none); "
        "forced: cascade wherever S >= 32"
    )
    head = (
        f"{'case':42} {'padded':>8} {'S':>5} {'default':>8} {'speedup':>8} {'forced':>8} {'speedup':>8} "
        f"{'meta pad':>9} {'meta def':>9}"
    )
    print(head)
    print("-" * len(head))
    for label, *spec in CASES:
        r = run_case(*spec, dtype, args.repeats, args.iters)
        print(
            f"{label:42} {r['padded']:8.3f} {r['default_shared']:>5} {r['default']:8.3f} "
            f"{r['padded'] / r['default']:7.2f}x {r['forced']:8.3f} {r['padded'] / r['forced']:7.2f}x "
            f"{r['padded_meta']:9.3f} {r['default_meta']:9.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
