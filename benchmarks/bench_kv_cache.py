"""KV cache dtype: tokens that fit, quality against transformers fp32, and a memory-bound workload.

    python benchmarks/bench_kv_cache.py [--quick]

1. Tokens in the same bytes: the default model's KV bytes per token for a float32 / bfloat16 / int8 / fp8 pool
   (int8 and fp8 carry a float32 scale per token per KV head) and the tokens a 1 GiB pool holds.
2. Quality: teacher-forced top-1 agreement with transformers float32 over 24 chat prompts x 48 tokens
   (transformers' own greedy continuation fed back), and the mean |change| of the reference token's
   log-prob, for each KV dtype on the float32 model and for the default (bfloat16) model. The prompts run
   in chunks of 8 tokens (--chunked-prefill-size 8) so that nearly every key is read back from the pool:
   a fresh prompt in one chunk attends to its own K/V before they are stored, and would hide the pool's dtype.
3. Memory-bound throughput: 32 requests of ~300 prompt + 128 output tokens through a pool that holds about a
   quarter of their working set; out tok/s and preemptions, auto (bfloat16) vs int8 KV, same pool bytes.
4. n = 8 samples of a ~600-token prompt at page size 16: prompt tokens computed, peak pages in use and wall
   time, with the samples forking from the first one (core/admission.py) and without (Admission's
   fork_samples off: each sample recomputes the prompt's partial last page).
Results: results/kv_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_info import git_commit, machine  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.kv_cache import KVCache  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain in one sentence what a CPU does.",
    "What is 17 plus 25?",
    "Give me a synonym for happy.",
    "How do plants make food?",
    "Tell me a fun fact about octopuses.",
    "What causes the seasons on Earth?",
    "Suggest a name for a pet turtle.",
    "How do I boil an egg?",
    "Why is the ocean salty?",
    "What is a prime number?",
    "Describe a rainbow to a child.",
    "What does a compiler do?",
    "Give two tips for better sleep.",
    "What is the tallest animal?",
    "Translate 'good morning' into Spanish.",
    "Why do cats purr?",
    "What is the difference between weather and climate?",
    "Write one sentence about autumn.",
    "How many continents are there?",
    "What is gravity?",
    "Recommend a book for a long train ride.",
]
NUM_TOKENS = 48
GIB = 1 << 30


def references(hf_model, tokenizer, questions, num_tokens):
    """(prompt ids, transformers' greedy continuation, its float32 log-prob of each continuation token).
    One batched generate, the prompts left-padded under an attention mask (each row's positions
    count from its first real token): on the 24 chat prompts the same 24 continuations as one prompt
    at a time, log-probs within 1e-5, in 11 s instead of 72 s (2-core Zen 4)."""
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for q in questions
    ]
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        gen = hf_model.generate(
            x,
            attention_mask=mask,
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        full_mask = torch.cat([mask, torch.ones(len(prompts), num_tokens, dtype=mask.dtype)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = hf_model(gen, attention_mask=full_mask, position_ids=positions).logits.float()
    lp = torch.log_softmax(logits, -1)
    out = []
    for row, prompt in enumerate(prompts):
        cont = gen[row, width:].tolist()
        assert len(cont) == num_tokens, len(cont)
        ref_lp = [lp[row, width - 1 + j, t].item() for j, t in enumerate(cont)]
        out.append((prompt, cont, ref_lp))
    return out


def teacher_forced(engine: Engine, refs) -> tuple[int, int, float]:
    """(agreeing positions, positions, mean |radixrt log-prob - transformers log-prob| of the reference token)."""
    agree = total = 0
    delta = 0.0
    for prompt, cont, ref_lp in refs:
        res = engine.generate(
            input_ids=prompt + cont,
            return_logprob=True,
            logprob_start_len=len(prompt),
            top_logprobs_num=1,
            sampling_params={"max_new_tokens": 0},
        )
        meta = res["meta_info"]
        # entry j predicts cont[j] (the first one predicts the first continuation token)
        assert len(meta["input_top_logprobs"]) == len(cont), len(meta["input_top_logprobs"])
        for j, (top, mine) in enumerate(
            zip(meta["input_top_logprobs"], meta["input_token_logprobs"])
        ):
            agree += top[0][1] == cont[j]
            delta += abs(mine[0] - ref_lp[j])
            total += 1
    return agree, total, delta / max(total, 1)


def tokens_per_budget() -> dict:
    from radixrt.runtime.model.weights import load_config, transformers_dir

    cfg = load_config(transformers_dir())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    out = {}
    for name, dtype in (
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("int8", torch.int8),
        ("fp8_e4m3", torch.float8_e4m3fn),
    ):
        per_token = KVCache.bytes_per_token(
            cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, dtype
        )
        out[name] = {"bytes_per_token": per_token, "tokens_per_gib": GIB // per_token}
    return out


def memory_bound(kv_cache_dtype: str, pool_bytes: int, n: int) -> dict:
    probe = Engine(kv_cache_dtype=kv_cache_dtype, max_total_tokens=1024)
    per_token = probe.scheduler.runner.kv_bytes_per_token
    probe.shutdown()
    engine = Engine(
        kv_cache_dtype=kv_cache_dtype,
        max_total_tokens=pool_bytes // per_token,
        max_running_requests=n,
    )
    try:
        prompts = [
            f"Request {i}: " + "Summarise the history of computing in detail. " * 30
            for i in range(n)
        ]
        params = {"temperature": 0, "max_new_tokens": 128, "ignore_eos": True}
        engine.generate(prompts[:2], {**params, "max_new_tokens": 4})  # warm-up
        before = engine.scheduler.stats.num_preemptions
        start = time.perf_counter()
        outs = engine.generate(prompts, params)
        elapsed = time.perf_counter() - start
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        return {
            "pool_tokens": pool_bytes // per_token,
            "out_tok_s": tokens / elapsed,
            "preemptions": engine.scheduler.stats.num_preemptions - before,
            "seconds": elapsed,
        }
    finally:
        engine.shutdown()


def n_samples(fork: bool) -> dict:
    engine = Engine(page_size=16, max_total_tokens=8192)
    engine.scheduler.admission.fork_samples = fork  # Admission(fork_samples=...)
    try:
        prompt = "Write a story about a lighthouse keeper. " * 75 + "Begin:"  # ~600 tokens
        engine.generate("warm-up", {"max_new_tokens": 2})
        engine.flush_cache()
        sched, stats = engine.scheduler, engine.scheduler.stats
        peak, run = [0], sched.runner.run

        def counting(plan, mask_sources=()):
            peak[0] = max(
                peak[0], sched.memory.allocator.num_pages - sched.memory.allocator.num_free
            )
            return run(plan, mask_sources)

        sched.runner.run = counting
        prompt_before, cached_before = stats.prompt_tokens, stats.cached_tokens
        start = time.perf_counter()
        engine.generate(prompt, {"n": 8, "temperature": 0.8, "seed": 1, "max_new_tokens": 16})
        elapsed = time.perf_counter() - start
        computed = (stats.prompt_tokens - prompt_before) - (stats.cached_tokens - cached_before)
        return {
            "prompt_tokens": len(engine.tokenizer.encode(prompt)),
            "prompt_tokens_computed": computed,
            "peak_pages": peak[0],
            "seconds": elapsed,
        }
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 prompts, 8 requests: a smoke run")
    ap.add_argument("--only-samples", action="store_true", help="section 4 only")
    args = ap.parse_args()
    results = {
        "commit": git_commit(),
        "machine": machine(),
        "tokens": tokens_per_budget(),
        "quality": {},
        "memory_bound": {},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kv_cache.json")
    if args.only_samples:  # section 4 into the last full run's results
        with open(path) as f:
            results = {**json.load(f), "n_samples_commit": git_commit(), "n_samples": {}}
    else:
        sections_1_to_3(results, args.quick)
    results["n_samples"] = {}
    print("\n== n = 8 samples of one prompt, page size 16 ==")
    for fork in (False, True):
        row = results["n_samples"]["fork" if fork else "no fork"] = n_samples(fork)
        print(
            f"  {'fork' if fork else 'no fork':>8}: prompt {row['prompt_tokens']} tokens, "
            f"{row['prompt_tokens_computed']} computed, peak {row['peak_pages']} pages, {row['seconds']:.2f} s"
        )
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"raw results: {path}")


def sections_1_to_3(results: dict, quick: bool) -> None:
    questions = QUESTIONS[:8] if quick else QUESTIONS
    print("== KV bytes per token and tokens per GiB (default model) ==")
    for name, row in results["tokens"].items():
        print(
            f"  {name:>9}: {row['bytes_per_token']:6d} B/token  {row['tokens_per_gib']:9d} tokens/GiB"
        )

    from transformers import AutoModelForCausalLM

    from radixrt.runtime.model.weights import load_tokenizer, transformers_dir

    model_dir = transformers_dir()
    hf = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    ).eval()
    refs = references(hf, load_tokenizer(model_dir), questions, NUM_TOKENS)
    del hf
    print(
        f"\n== teacher-forced top-1 agreement with transformers float32 ({len(refs)} prompts x {NUM_TOKENS}) =="
    )
    for model_dtype in ("float32", "auto"):
        for kv in ("auto", "int8", "fp8_e4m3"):
            engine = Engine(
                dtype=model_dtype, kv_cache_dtype=kv, chunked_prefill_size=8, page_size=8
            )
            try:
                agree, total, delta = teacher_forced(engine, refs)
                label = f"model {engine.scheduler.runner.dtype_name}, KV {kv}"
            finally:
                engine.shutdown()
            results["quality"][label] = {
                "agreement": agree / total,
                "positions": total,
                "mean_abs_dlogprob": delta,
            }
            print(
                f"  {label:>32}: {agree}/{total} = {agree / total:.4f}  mean |d logprob| {delta:.4f}"
            )

    n = 8 if quick else 32
    # the working set: n x (~330 prompt + 128 output) tokens of bf16 KV; the pool holds a quarter of it
    bf16_per_token = results["tokens"]["bfloat16"]["bytes_per_token"]
    pool_bytes = n * 460 * bf16_per_token // 4
    print(
        f"\n== memory-bound: {n} requests x (~330 prompt + 128 out), pool {pool_bytes / 2**20:.1f} MiB =="
    )
    for kv in ("auto", "int8"):
        row = results["memory_bound"][kv] = memory_bound(kv, pool_bytes, n)
        print(
            f"  KV {kv:>5}: pool {row['pool_tokens']} tokens, {row['out_tok_s']:.1f} out tok/s, "
            f"{row['preemptions']} preemptions"
        )


if __name__ == "__main__":
    main()
