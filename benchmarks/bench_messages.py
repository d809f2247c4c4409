"""Encode + decode cost of what crosses a process boundary in one decode step, per message kind.

A step of a batch of B decoding requests sends: the scheduler's token deltas to the detokenizer
(BatchTokenOut), the detokenizer's text deltas to the HTTP process (BatchTextOut, read there as one
dict per request), and under tensor parallelism the step's plan to the other ranks. A request's
arrival sends one TokenizedGenerateReq. Runs against the code it is in (compare two commits with
`git stash` / a worktree); prints microseconds per message, best of --repeats.

    python benchmarks/bench_messages.py --batch 32 --prompt-len 512
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from radixrt.runtime import messages
from radixrt.runtime.core.plan import PlanItem
from radixrt.runtime.request.options import RequestOptions

TYPED = hasattr(messages, "TextOut")  # this tree's messages are msgspec structs


def _token_outs(batch: int) -> list:
    outs = [
        messages.TokenOut(
            rid=f"req-{i:08d}",
            new_ids=[1000 + i],
            prompt_tokens=512,
            completion_tokens=17,
            cached_tokens=256,
        )
        for i in range(batch)
    ]
    if TYPED:
        return outs
    import dataclasses

    return [dataclasses.asdict(o) for o in outs]


def _text_outs(token_outs: list) -> list:
    if TYPED:
        import msgspec

        return [messages.TextOut(**msgspec.structs.asdict(o), text=" word") for o in token_outs]
    return [{**o, "text": " word"} for o in token_outs]


def _read_text_outs(data: bytes) -> list[dict]:
    """What the HTTP process does with a BatchTextOut: one dict per request for its queues."""
    batch = messages.decode(data)
    return messages.output_dicts(batch) if TYPED else batch.outputs


def _plan(batch: int) -> list[PlanItem]:
    return [
        PlanItem(row=i, new_ids=[5], computed_len=600, slots=[600 + i], write_start=600)
        for i in range(batch)
    ]


def _plan_round_trip(plan: list[PlanItem]) -> list[PlanItem]:
    if TYPED:
        from radixrt.runtime.core import plan as plan_mod

        return plan_mod.decode_forward(plan_mod.encode_forward(plan))
    import orjson

    data = orjson.dumps({"items": [it.to_wire() for it in plan]})
    return [PlanItem.from_wire(it) for it in orjson.loads(data)["items"]]


def _best_us(fn: Callable[[], object], repeats: int, inner: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=2000)
    args = ap.parse_args()

    token_outs = _token_outs(args.batch)
    token_batch = messages.BatchTokenOut(outputs=token_outs)
    text_batch = messages.BatchTextOut(outputs=_text_outs(token_outs))
    text_bytes = messages.encode(text_batch)
    req = messages.TokenizedGenerateReq(
        rid="req-00000001",
        input_ids=list(range(args.prompt_len)),
        sampling_params={"temperature": 0.0, "max_new_tokens": 64, "stop": ["\n\n"]},
        options=RequestOptions(stream=True, client="c" * 16),
    )
    plan = _plan(args.batch)
    cases = {
        f"BatchTokenOut x{args.batch} encode+decode": lambda: messages.decode(
            messages.encode(token_batch)
        ),
        f"BatchTextOut x{args.batch} encode": lambda: messages.encode(text_batch),
        f"BatchTextOut x{args.batch} decode to dicts": lambda: _read_text_outs(text_bytes),
        f"TokenizedGenerateReq {args.prompt_len} ids encode+decode": lambda: messages.decode(
            messages.encode(req)
        ),
        f"TP step plan x{args.batch} encode+decode": lambda: _plan_round_trip(plan),
    }
    print(f"messages: {'msgspec structs' if TYPED else 'orjson dicts'}; best of {args.repeats}")
    for name, fn in cases.items():
        print(f"  {name:<48} {_best_us(fn, args.repeats, args.inner):8.2f} us")


if __name__ == "__main__":
    main()
