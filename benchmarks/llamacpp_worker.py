"""Runs inside llama-cpp-python's own venv (bench_vs_llamacpp.py starts it): the first stdin line is the
setup, then one JSON case per line, answered with one JSON line on stdout. Imports nothing from radixrt.

A case is one prompt of token ids and a forced number of greedy tokens: the prompt is evaluated in one
call (prefill, timed), then each new token is the argmax of the last logits, fed back one at a time
(decode, timed: n - 1 steps for n tokens), end of text or not, so both engines produce the same number of tokens.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    job = json.loads(sys.stdin.readline())
    import numpy as np
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(
        model_path=job["gguf"],
        n_ctx=job["n_ctx"],
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        n_batch=job["n_batch"],
        logits_all=False,
        verbose=False,
    )
    vocab = llm.n_vocab()
    print(json.dumps({"event": "ready", "startup_s": time.perf_counter() - started}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(case["prompt"])
        prefill_s = time.perf_counter() - t0
        out: list[int] = []
        t1 = time.perf_counter()
        for i in range(case["new_tokens"]):
            # the last evaluated token's logits (without logits_all, llm.scores is not filled)
            token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
            out.append(token)
            # the first token came from the prefill: n - 1 decode steps
            if i + 1 < case["new_tokens"]:
                llm.eval([token])
        decode_s = time.perf_counter() - t1
        print(
            json.dumps(
                {"event": "case", "prefill_s": prefill_s, "decode_s": decode_s, "output_ids": out}
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
