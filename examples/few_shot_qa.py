"""Few-shot multiple-choice QA with `select`.

The few-shot examples are the same for every question, so the radix cache computes them
once; each choice is scored from prompt logprobs in one batched request.

    python examples/few_shot_qa.py                # in-process Engine, default model
    python examples/few_shot_qa.py --url http://127.0.0.1:30000
"""

from example_backend import parse_args

import radixrt as sgl

EXAMPLES = [
    ("What is the capital of France?", ["Paris", "Rome", "Madrid"], "Paris"),
    ("Which animal says 'moo'?", ["cat", "cow", "dog"], "cow"),
    ("How many legs does a spider have?", ["six", "eight", "ten"], "eight"),
]
QUESTIONS = [
    ("What color is the sky on a clear day?", ["green", "blue", "red"]),
    ("Which is a fruit?", ["apple", "carrot", "potato"]),
    ("What do bees make?", ["milk", "honey", "silk"]),
]


@sgl.function
def few_shot_qa(s, question, choices):
    s += "Answer each question with one of the options.\n\n"
    for q, opts, answer in EXAMPLES:
        s += f"Question: {q}\nOptions: {', '.join(opts)}\nAnswer: {answer}\n\n"
    s += "Question: " + question + "\nOptions: " + ", ".join(choices) + "\nAnswer: "
    s += sgl.select("answer", choices=choices)


def main() -> None:
    parse_args(__doc__)
    states = few_shot_qa.run_batch([{"question": q, "choices": c} for q, c in QUESTIONS])
    for (question, _), state in zip(QUESTIONS, states):
        scores = state.get_meta_info("answer")["normalized_prompt_logprobs"]
        print(f"{question} -> {state['answer']}  (mean logprobs {[round(x, 2) for x in scores]})")


if __name__ == "__main__":
    main()
