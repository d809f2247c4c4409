"""Beam search on the default model: radixrt vs transformers' beam search, side by side in one run.

    python benchmarks/bench_beam.py [--widths 1 2 4 8] [--prompts 4] [--new-tokens 32] [--repeats 3]

For each beam width (1 = greedy decoding, the baseline) both engines run the same prompts to exactly
--new-tokens tokens (min_new_tokens = max_new_tokens: EOS blocked in both, transformers' own
MinNewTokensLengthLogitsProcessor on its side), in the dtype radixrt's default picks here (auto):
  radixrt        Engine.beam_search, every prompt in one call (the prompts' beams share its batches)
  transformers   generate(num_beams=k, do_sample=False), the prompts as one left-padded batch
Printed per width: wall time (median of --repeats alternating runs, min-max), beam tokens/s (tokens
every live beam decoded: prompts x width x new tokens, per second), the ratio, how many prompts'
best beams agree between the two, and radixrt's peak KV pages per request (most pages its beams
held at once, meta_info beam_peak_pages) against the no-sharing bound (width x the pages of one
sequence). Raw results go to benchmarks/results/beam.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from run_info import git_commit, machine  # noqa: E402
from workloads import QUESTIONS  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import transformers_dir  # noqa: E402


def prompts_for(n: int) -> list[str]:
    return [f"Question: {q}\nAnswer:" for q in QUESTIONS[:n]]


class Transformers:
    def __init__(self, model_dir: str, dtype: torch.dtype, eos: list[int]):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.eos = eos
        self.pad = 1 if 1 not in eos else 3

    def run(self, prompts: list[str], width: int, new_tokens: int) -> tuple[float, list[list[int]]]:
        ids = [self.tok.encode(p, add_special_tokens=False) for p in prompts]
        longest = max(len(x) for x in ids)
        batch = torch.tensor([[self.pad] * (longest - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (longest - len(x)) + [1] * len(x) for x in ids])
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                batch,
                attention_mask=mask,
                num_beams=width,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                eos_token_id=self.eos,
                pad_token_id=self.pad,
            )
        return time.perf_counter() - t0, out[:, longest:].tolist()


def run_radixrt(engine: Engine, prompts: list[str], width: int, new_tokens: int):
    params = {"min_new_tokens": new_tokens}
    engine.flush_cache()
    t0 = time.perf_counter()
    if width == 1:
        params.update(temperature=0, max_new_tokens=new_tokens)
        outs = [[o] for o in engine.generate(prompts, params)]
    else:
        outs = engine.beam_search(
            prompts,
            beam_width=width,
            max_new_tokens=new_tokens,
            num_return=1,
            sampling_params=params,
        )
    return time.perf_counter() - t0, outs


def summary(times: list[float]) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    prompts = prompts_for(args.prompts)
    engine = Engine()
    dtype = getattr(torch, engine.scheduler.model_info["dtype"])
    page_size = engine.config.page_size
    hf = Transformers(str(transformers_dir()), dtype, sorted(engine.scheduler.eos_ids))
    print(
        f"dtype {dtype}, {len(prompts)} prompts, {args.new_tokens} new tokens, page size {page_size}"
    )
    rows = []
    for width in args.widths:
        run_radixrt(engine, prompts, width, args.new_tokens)  # warm-up (compiles new batch shapes)
        hf.run(prompts, width, args.new_tokens)
        ours_t, theirs_t = [], []
        for _ in range(args.repeats):
            t, outs = run_radixrt(engine, prompts, width, args.new_tokens)
            ours_t.append(t)
            t, hf_ids = hf.run(prompts, width, args.new_tokens)
            theirs_t.append(t)
        engine.check_integrity()
        best = [o[0]["output_ids"] for o in outs]
        agree = sum(b == h[: len(b)] for b, h in zip(best, hf_ids))
        beam_tokens = len(prompts) * width * args.new_tokens
        ours, theirs = summary(ours_t), summary(theirs_t)
        row = {
            "width": width,
            "radixrt": ours,
            "transformers": theirs,
            "beam_tokens": beam_tokens,
            "radixrt_tok_s": beam_tokens / ours["median_s"],
            "transformers_tok_s": beam_tokens / theirs["median_s"],
            "speedup": theirs["median_s"] / ours["median_s"],
            "best_beam_agreement": f"{agree}/{len(prompts)}",
        }
        if width > 1:
            peaks = [o[0]["meta_info"]["beam_peak_pages"] for o in outs]
            bounds = [
                width * -(-(o[0]["meta_info"]["prompt_tokens"] + args.new_tokens) // page_size)
                for o in outs
            ]
            row["peak_pages"], row["no_sharing_bound"] = peaks, bounds
            row["peak_over_bound"] = statistics.mean(p / b for p, b in zip(peaks, bounds))
        rows.append(row)
        pages = ""
        if width > 1:
            pages = (
                f"  peak pages {statistics.mean(row['peak_pages']):.0f} vs no-sharing "
                f"{statistics.mean(row['no_sharing_bound']):.0f} ({row['peak_over_bound']:.2f}x)"
            )
        print(
            f"width {width}: radixrt {ours['median_s']:.2f} s ({ours['min_s']:.2f}-{ours['max_s']:.2f})"
            f" {row['radixrt_tok_s']:.0f} beam tok/s | transformers {theirs['median_s']:.2f} s "
            f"({theirs['min_s']:.2f}-{theirs['max_s']:.2f}) {row['transformers_tok_s']:.0f} beam "
            f"tok/s | {row['speedup']:.2f}x | best beams agree {row['best_beam_agreement']}{pages}"
        )
    engine.shutdown()
    out = {
        "commit": git_commit(),
        "machine": machine(),
        "dtype": str(dtype),
        "prompts": len(prompts),
        "new_tokens": args.new_tokens,
        "rows": rows,
    }
    path = os.path.join(os.path.dirname(__file__), "results", "beam.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
