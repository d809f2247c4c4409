"""radixrt vs llama.cpp on one stream: the same GGUF, the same token ids, side by side in one run.

One ~520-token few-shot prompt (bench_vs_vllm.py's prefix and a question) and 64 forced greedy tokens:
  decode   tok/s of the 63 steps after the first token (radixrt: the prompt cached, so the time is
           generate(64 tokens) - generate(1 token); llama.cpp: its 63 single-token evals)
  prefill  prompt tok/s of the whole prompt, nothing cached
radixrt runs its default config (`Engine()`). llama.cpp is llama-cpp-python in its own venv, built from
source for this CPU without AMX (its AMX code crashes in llama_decode on these VMs: SIGSEGV, exit -11).
GGML_NATIVE compiles for every ISA extension the CPU reports, AMX included where it has AMX whatever the
GGML_AMX_* flags say, so on a CPU without AMX (a Zen 4, whose lack of AVX-VNNI breaks the explicit list
with SIGILL) build with

    python -m venv ~/.cache/radixrt/llamacpp-venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" ~/.cache/radixrt/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36

and on a CPU with AMX (an Intel Xeon since Sapphire Rapids) with the extensions listed, AMX left out:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \\
      -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \\
      ~/.cache/radixrt/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36

When it is missing the script says how to make it and skips it, never faking its figures:

    python benchmarks/bench_vs_llamacpp.py [--repeats 5]
Results: results/vs_llamacpp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_vllm import FEW_SHOT  # noqa: E402
from run_info import git_commit, machine  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import default_gguf_path, load_tokenizer, resolve_model  # noqa: E402

DEFAULT_PYTHON = pathlib.Path.home() / ".cache/radixrt/llamacpp-venv/bin/python"
RESULTS = pathlib.Path(__file__).parent / "results"
NEW_TOKENS = 64


def prompt_ids(tokenizer) -> list[int]:
    text = (
        "You are a helpful assistant. Answer each question in one or two clear sentences.\n\n"
        + "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in (FEW_SHOT * 2)[:17])
        + "Question: Can you explain, in simple words, how volcanoes work and why they matter?\nAnswer:"
    )
    return tokenizer.encode(text, add_special_tokens=False)


class LlamaCppWorker:
    def __init__(self, python: pathlib.Path, gguf: str, threads: int):
        self.proc = subprocess.Popen(
            [str(python), str(pathlib.Path(__file__).parent / "llamacpp_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._send({"gguf": gguf, "threads": threads, "n_ctx": 2048, "n_batch": 512})
        self.startup_s = self._read()["startup_s"]

    def _send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"llama.cpp worker exited with code {self.proc.wait()}")

    def run(self, prompt: list[int]) -> dict:
        self._send({"prompt": prompt, "new_tokens": NEW_TOKENS})
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_radixrt(engine: Engine, prompt: list[int]) -> dict:
    def gen(n: int) -> tuple[float, list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": n, "min_new_tokens": n, "ignore_eos": True}
        t0 = time.perf_counter()
        out = engine.generate(input_ids=prompt, sampling_params=params)
        return time.perf_counter() - t0, out["output_ids"]

    engine.flush_cache()
    prefill_s, _ = gen(1)  # nothing cached: the whole prompt, then one token
    one_s, _ = gen(1)  # the prompt cached from here on
    total_s, ids = gen(NEW_TOKENS)
    return {"prefill_s": prefill_s, "decode_s": total_s - one_s, "output_ids": ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--llamacpp-python", default=os.environ.get("RADIXRT_LLAMACPP_PYTHON", str(DEFAULT_PYTHON))
    )
    ap.add_argument("--out", default=str(RESULTS / "vs_llamacpp.json"))
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    prompt = prompt_ids(load_tokenizer(str(resolve_model(None))))
    engines: dict[str, object] = {}
    python = pathlib.Path(args.llamacpp_python)
    if python.exists():
        engines["llama.cpp"] = LlamaCppWorker(python, str(default_gguf_path()), threads)
    else:
        print(
            f"llama-cpp-python not found at {python}: skipping it (make its venv with the commands in this "
            "script's docstring, or point --llamacpp-python / RADIXRT_LLAMACPP_PYTHON at one).",
            file=sys.stderr,
        )
    engine = Engine()
    engines[f"radixrt {engine.scheduler.runner.dtype_name}"] = engine

    def run(e: object) -> dict:
        return e.run(prompt) if isinstance(e, LlamaCppWorker) else run_radixrt(e, prompt)

    for e in engines.values():  # warm-up, not timed
        run(e)
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for r in range(args.repeats):  # alternating
        for name, e in engines.items():
            runs[name].append(run(e))
            print(
                f"  repeat {r + 1} {name:16s} decode {runs[name][-1]['decode_s']:.3f} s "
                f"prefill {runs[name][-1]['prefill_s']:.3f} s",
                file=sys.stderr,
            )
    rows = {}
    for name, rs in runs.items():
        rows[name] = {
            "decode_tok_s": statistics.median((NEW_TOKENS - 1) / x["decode_s"] for x in rs),
            "prefill_tok_s": statistics.median(len(prompt) / x["prefill_s"] for x in rs),
            "output_ids": rs[-1]["output_ids"],
        }
    peer = rows.get("llama.cpp")
    print(
        f"\none prompt of {len(prompt)} tokens, {NEW_TOKENS} forced greedy tokens, {threads} threads each, "
        f"median of {args.repeats}"
    )
    print(
        "| engine | decode tok/s | vs llama.cpp | prefill tok/s | vs llama.cpp |\n|---|---|---|---|---|"
    )
    for name, row in rows.items():
        d = f"{row['decode_tok_s'] / peer['decode_tok_s']:.2f}x" if peer else "-"
        p = f"{row['prefill_tok_s'] / peer['prefill_tok_s']:.2f}x" if peer else "-"
        print(f"| {name} | {row['decode_tok_s']:.1f} | {d} | {row['prefill_tok_s']:.1f} | {p} |")
    if peer:
        mine = next(r for n, r in rows.items() if n != "llama.cpp")["output_ids"]
        same = next(
            (i for i, (a, b) in enumerate(zip(mine, peer["output_ids"])) if a != b), NEW_TOKENS
        )
        print(f"greedy outputs agree on the first {same} of {NEW_TOKENS} tokens")
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "commit": git_commit(),
                "machine": machine(),
                "prompt_tokens": len(prompt),
                "new_tokens": NEW_TOKENS,
                "rows": rows,
            },
            indent=1,
        )
    )
    for e in engines.values():
        e.close() if isinstance(e, LlamaCppWorker) else e.shutdown()


if __name__ == "__main__":
    main()
