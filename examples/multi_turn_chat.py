"""Multi-turn chat: roles rendered with the model's own chat template.

Each turn's request carries the whole conversation; the earlier turns are already in
the radix cache, so only the new turn is computed.

    python examples/multi_turn_chat.py [--url http://127.0.0.1:30000]
"""

from example_backend import parse_args

import radixrt as sgl


@sgl.function
def chat(s, turns):
    s += sgl.system("You are a friendly assistant. Keep answers to one or two sentences.")
    for i, question in enumerate(turns):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=48))


def main() -> None:
    parse_args(__doc__)
    turns = ["What is the tallest mountain on Earth?", "How high is it?", "Who first climbed it?"]
    state = chat.run(turns=turns, temperature=0)
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")
    for i in range(len(turns)):
        meta = state.get_meta_info(f"answer_{i}")
        print(
            f"turn {i}: prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} from the cache"
        )


if __name__ == "__main__":
    main()
