"""What each GGUF quantisation costs in quality, served by radixrt: teacher-forced top-1 agreement with
the float32 model the files were made from.

    python benchmarks/bench_gguf_quality.py [--types Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K] [--questions 8]

The reference is the default model dequantised to float32 (weights.transformers_dir()). Its greedy
answers to --questions chat questions are the fixed text; every file below is made from the same
float32 weights (tests/gguf_writer.py: llama.cpp's layout, each matrix in the type, a k-quant's
fallback -- Q5_0 / Q5_1 / Q8_0, as llama.cpp picks -- where a row is not whole 256-wide
super-blocks, which the default model's 576-wide rows are not), served by radixrt kept quantised,
dequantised at load into float32. Printed per type: the file's size, the share of matrix weights in
the type itself (the rest in its fallback), radixrt's first start on the file (the one-time copy
of its config, tokenizer and blocks included), and the share of answer positions whose top-1 next
token equals the float32 model's (plus the mean |logprob| difference of the reference's own token).
The default model ships as Q4_1 with a Q8_0 embedding; here the embedding is quantised in the type
too, so no type round-trips the reference exactly. Raw results go to
benchmarks/results/gguf_quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import gguf

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from gguf_writer import matrix_type, write_gguf  # noqa: E402
from run_info import git_commit, machine  # noqa: E402
from workloads import QUESTIONS  # noqa: E402

from radixrt import Engine  # noqa: E402
from radixrt.runtime.model.weights import (  # noqa: E402
    default_gguf_path,
    load_config,
    load_state_dict,
    transformers_dir,
)

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
ANSWER_TOKENS = 48


def scored(engine: Engine, texts: list[str], starts: list[int]) -> list[list[tuple[float, int]]]:
    """Per text, from its answer's start: (logprob of the text's own next token, top-1 id)."""
    outs = engine.generate(
        texts,
        {"max_new_tokens": 1, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=1,
    )
    rows = []
    for out, start in zip(outs, starts):
        meta = out["meta_info"]
        own = [lp for lp, _, _ in meta["input_token_logprobs"]]
        top = [t[0][1] if t else None for t in meta["input_top_logprobs"]]
        rows.append([(own[i], top[i - 1]) for i in range(start, len(own))])
    return rows


def agreement(ref, got) -> tuple[float, float]:
    same = diff = n = 0
    for r, g in zip(ref, got):
        for (lp_r, top_r), (lp_g, top_g) in zip(r, g):
            same += top_r == top_g
            diff += abs(lp_r - lp_g)
            n += 1
    return same / n, diff / n


def in_type_share(state: dict, qtype: gguf.GGMLQuantizationType) -> float:
    matrices = [t for t in state.values() if t.dim() == 2]
    own = sum(t.numel() for t in matrices if matrix_type(qtype, t.shape[1]) == qtype)
    return own / sum(t.numel() for t in matrices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--questions", type=int, default=8)
    args = ap.parse_args()
    ref_dir = transformers_dir()
    state, config = load_state_dict(ref_dir), load_config(ref_dir)
    fp32 = Engine(model_path=str(ref_dir), dtype="float32")
    chats = [
        fp32.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS[: args.questions]
    ]
    answers = fp32.generate(chats, {"max_new_tokens": ANSWER_TOKENS, "temperature": 0})
    texts = [c + a["text"] for c, a in zip(chats, answers)]
    starts = [len(fp32.tokenizer(c, add_special_tokens=False).input_ids) for c in chats]
    reference = scored(fp32, texts, starts)
    fp32.shutdown()
    results = {"commit": git_commit(), "machine": machine(), "types": {}}
    print(
        f"{'type':6} {'file MB':>8} {'in type':>8} {'1st start s':>11} {'top-1 agree':>12} {'|dlogp|':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RADIXRT_CACHE_DIR"] = str(pathlib.Path(tmp) / "cache")
        for name in args.types:
            qtype = gguf.GGMLQuantizationType[name]
            path = write_gguf(
                state, config, pathlib.Path(tmp) / f"smollm2-{name}.gguf", qtype,
                default_gguf_path(),
            )  # fmt: skip
            t0 = time.perf_counter()
            engine = Engine(model_path=str(path), dtype="float32")
            start_s = time.perf_counter() - t0
            try:
                agree, dlogp = agreement(reference, scored(engine, texts, starts))
            finally:
                engine.shutdown()
            row = {
                "file_mb": path.stat().st_size / 2**20,
                "in_type_share": in_type_share(state, qtype),
                "start_s": start_s,
                "top1_agreement": agree,
                "mean_abs_logprob_diff": dlogp,
            }
            results["types"][name] = row
            print(
                f"{name:6} {row['file_mb']:8.1f} {row['in_type_share']:8.0%} {start_s:11.1f} "
                f"{agree:12.1%} {dlogp:8.3f}"
            )
    out = pathlib.Path(__file__).parent / "results" / "gguf_quality.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
