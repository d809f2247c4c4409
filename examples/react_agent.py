"""A ReAct-style agent loop: think, pick a tool with `select`, act in Python, observe.

Every step's request extends the previous text, so the radix cache makes each step
cost only its new tokens.

    python examples/react_agent.py [--url http://127.0.0.1:30000]
"""

import re

from example_backend import parse_args

import radixrt as sgl

FACTS = {
    "paris": "Paris is the capital of France; about 2.1 million people live there.",
    "eiffel tower": "The Eiffel Tower is 330 metres tall and was finished in 1889.",
}


def lookup(query: str) -> str:
    for key, fact in FACTS.items():
        if key in query.lower():
            return fact
    return "No entry found."


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression.strip() or "x"):
        return "Only arithmetic is supported."
    try:
        # digits and operators only (checked above)
        return str(eval(expression, {"__builtins__": {}}))
    except Exception as e:  # a malformed expression is an observation, not a crash
        return f"Error: {e}"


TOOLS = {"lookup": lookup, "calculate": calculate}

# One worked example: a small model follows the format far better with it.
DEMO = (
    "Question: How many people live in Paris, in thousands?\n"
    "Thought 1: I should look up the population of Paris.\n"
    "Action 1: lookup[paris]\n"
    "Observation 1: " + FACTS["paris"] + "\n"
    "Thought 2: 2.1 million is 2.1 * 1000 thousand.\n"
    "Action 2: calculate[2.1 * 1000]\n"
    "Observation 2: 2100.0\n"
    "Thought 3: I have the answer.\n"
    "Action 3: finish[2100 thousand]\n\n"
)


@sgl.function
def agent(s, question, max_steps=3):
    s += (
        "Answer the question by thinking and using tools.\n"
        "Tools: lookup[topic] finds a fact, calculate[expression] does arithmetic, finish[answer] answers.\n\n"
        + DEMO
        + "Question: "
        + question
        + "\n"
    )
    for step in range(max_steps):
        s += f"Thought {step + 1}:" + sgl.gen(f"thought_{step}", max_tokens=32, stop="\n") + "\n"
        s += f"Action {step + 1}: " + sgl.select(
            f"tool_{step}", choices=["lookup", "calculate", "finish"]
        )
        s += "[" + sgl.gen(f"input_{step}", max_tokens=16, stop="]") + "]\n"
        tool, tool_input = s[f"tool_{step}"], s[f"input_{step}"]
        if tool == "finish":
            return tool_input
        s += f"Observation {step + 1}: {TOOLS[tool](tool_input)}\n"
    s += "Final answer:" + sgl.gen("final", max_tokens=24, stop="\n")
    return s["final"]


def main() -> None:
    parse_args(__doc__)
    state = agent.run(question="How tall is the Eiffel Tower in centimetres?", temperature=0)
    print(state.text())
    print("->", state.ret_value)


if __name__ == "__main__":
    main()
