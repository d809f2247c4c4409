"""Tree of thought with nested forks.

The question is cached (and pinned) once; each level forks the state, the branches run
in parallel and their requests are batched together; a `select` judges each leaf.

    python examples/tree_of_thought.py [--url http://127.0.0.1:30000]
"""

from example_backend import parse_args

import radixrt as sgl

NUM_PLANS = 2
NUM_STEPS = 2


@sgl.function
def tree_of_thought(s, question):
    s += sgl.system("You solve problems step by step.")
    s += sgl.user(question)
    s += sgl.assistant_begin()
    plans = s.fork(NUM_PLANS)
    # every plan is generated in parallel (one batch), then each plan forks its steps
    plans += lambda i: (
        f"Plan {i + 1}: "
        + sgl.gen("plan", max_tokens=24, stop="\n", temperature=0.8, seed=i)
        + "\n"
    )
    step_groups = []
    for i, plan in enumerate(plans):
        steps = plan.fork(NUM_STEPS)
        steps += lambda j, i=i: (
            "Next step: "
            + sgl.gen("step", max_tokens=24, stop="\n", temperature=0.8, seed=10 * i + j)
            + "\nIs this step sound? "
            + sgl.select("sound", choices=["yes", "no"])
        )
        step_groups.append(steps)
    for steps in step_groups:
        steps.join()
    plans.join()
    s += sgl.assistant_end()


def main() -> None:
    parse_args(__doc__)
    state = tree_of_thought.run(
        question="A farmer has 3 cows and buys 2 more. Each cow gives 4 liters of "
        "milk a day. How much milk does he get per day?"
    )
    for i, (plan, steps, verdicts) in enumerate(zip(state["plan"], state["step"], state["sound"])):
        print(f"plan {i + 1}: {plan.strip()}")
        for step, verdict in zip(steps, verdicts):
            print(f"    step: {step.strip()}  [sound: {verdict}]")


if __name__ == "__main__":
    main()
