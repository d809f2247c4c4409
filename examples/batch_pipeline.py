"""A run_batch pipeline: classify, then summarize, many documents at once.

`run_batch` runs the programs on threads, so their requests meet in the same batches,
and pre-caches the constant instructions every program starts with.

    python examples/batch_pipeline.py [--url http://127.0.0.1:30000] [--progress]
"""

import time

from example_backend import parse_args

import radixrt as sgl

INSTRUCTIONS = (
    "You are a news desk assistant. For each article, first name its section, then write a "
    "headline of at most ten words.\n\n"
)
ARTICLES = [
    "The central bank raised interest rates by a quarter point on Tuesday, citing persistent inflation.",
    "The home team won the championship after a last-minute goal in extra time.",
    "Researchers unveiled a battery that charges in five minutes and lasts a decade.",
    "The city council approved a new park along the river, to open next summer.",
    "A new smartphone with a foldable screen goes on sale next week.",
    "Heavy rain is expected across the region this weekend, with flood warnings in place.",
]


@sgl.function
def desk(s, article):
    s += INSTRUCTIONS + "Article: " + article + "\n"
    s += "Section: " + sgl.select(
        "section", choices=["business", "sports", "science", "local", "weather"]
    )
    s += "\nHeadline:" + sgl.gen("headline", max_tokens=16, stop="\n")


def main() -> None:
    args = parse_args(
        __doc__,
        lambda p: p.add_argument("--progress", action="store_true", help="show a progress bar"),
    )
    start = time.time()
    states = desk.run_batch(
        [{"article": a} for a in ARTICLES], temperature=0, progress_bar=args.progress
    )
    elapsed = time.time() - start
    for article, state in zip(ARTICLES, states):
        if state.error() is not None:
            print(f"FAILED: {state.error()}")
            continue
        print(f"[{state['section']:>8}] {state['headline'].strip()}  <- {article[:50]}...")
    print(f"{len(ARTICLES)} programs in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
